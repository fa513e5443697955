"""When a schedule's ticks fall: a cron expression read by croniter, in a zone of the IANA
database read by zoneinfo. Pure: no I/O beyond zoneinfo's own files.

Daylight-saving changes follow cron's custom. A wall-clock time skipped by a spring-forward
fires at the first moment after the gap (croniter's behaviour). A wall-clock time that happens
twice at a fall-back fires once, at its first occurrence, unless the hour field is `*`: such an
expression runs on real time, every matching minute of both repeated hours."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

MAX_CRON_CHARS = 200
MAX_TIMEZONE_CHARS = 64
# Five fields (minute hour day month weekday), or six with seconds first (as Quartz, Spring
# and node-cron read a sixth field); or an alias such as `@daily`.
_FIELDS = (5, 6)
# A tick must come within this many years, or the expression never fires (`0 0 31 2 *`).
_YEARS_BETWEEN_TICKS = 8
_ONE_MICROSECOND = timedelta(microseconds=1)


class CronInvalid(ValueError):
    """The expression is not one croniter reads as five or six fields, or never fires."""


class TimezoneInvalid(ValueError):
    """The zone is not a key of the IANA time zone database."""


@dataclass(frozen=True)
class Cron:
    expression: str
    zone: ZoneInfo

    @property
    def seconds(self) -> bool:
        return len(self.expression.split()) == 6

    def _iterator(self, start: datetime) -> Any:
        return croniter(
            self.expression,
            start.astimezone(self.zone),
            second_at_beginning=self.seconds,
            max_years_between_matches=_YEARS_BETWEEN_TICKS,
        )

    def _real_time(self) -> bool:
        """Whether the hour field is `*`: both repeated hours of a fall-back then fire."""
        parsed = croniter(self.expression, second_at_beginning=self.seconds)
        expanded = cast(list[list[Any]], parsed.expanded)
        hours = expanded[2] if self.seconds else expanded[1]
        return hours == ["*"]

    def _repeat(self, tick: datetime) -> bool:
        """Whether `tick` is the second occurrence of its wall-clock time (a fall-back)."""
        local = tick.astimezone(self.zone)
        return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment`, in UTC."""
        ticks = self._iterator(moment)
        real_time = self._real_time()
        while True:
            tick = cast(datetime, ticks.get_next(datetime)).astimezone(UTC)
            if real_time or not self._repeat(tick):
                return tick

    def latest_at(self, moment: datetime) -> datetime:
        """The last tick at or before `moment`, in UTC."""
        ticks = self._iterator(moment + _ONE_MICROSECOND)
        real_time = self._real_time()
        while True:
            tick = cast(datetime, ticks.get_prev(datetime)).astimezone(UTC)
            if real_time or not self._repeat(tick):
                return tick


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name` (`Europe/Berlin`, `UTC`); TimezoneInvalid for anything else."""
    if not name or len(name) > MAX_TIMEZONE_CHARS:
        raise TimezoneInvalid(f"must be an IANA time zone of 1 to {MAX_TIMEZONE_CHARS} characters")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise TimezoneInvalid(
            f"{name!r} is not an IANA time zone (such as `Europe/Berlin` or `UTC`)"
        ) from None


def parse(expression: str, timezone: str, now: datetime) -> Cron:
    """The schedule `expression` in `timezone`, checked to fire after `now`; CronInvalid or
    TimezoneInvalid saying what is wrong."""
    tz = zone(timezone)
    text = " ".join(expression.split())
    if not text or len(text) > MAX_CRON_CHARS:
        raise CronInvalid(f"must be a cron expression of 1 to {MAX_CRON_CHARS} characters")
    if not text.startswith("@") and len(text.split()) not in _FIELDS:
        raise CronInvalid(
            f"{text!r} has {len(text.split())} fields: give five (minute hour day month"
            " weekday), or six with seconds first"
        )
    cron = Cron(text, tz)
    try:
        cron.next_after(now)
    except CroniterBadDateError:
        raise CronInvalid(
            f"{text!r} never fires (no tick within {_YEARS_BETWEEN_TICKS} years)"
        ) from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise CronInvalid(f"{text!r} is not a cron expression: {exc}") from None
    return cron
