"""The schedules' next-tick function (app/cron.py, croniter with zoneinfo) and the scheduler's
choice of the tick a due schedule fires for, as properties across daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cron import Cron, CronInvalid, TimezoneInvalid, parse
from app.runtime.scheduler import due_tick

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "UTC"]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
# Days of 2026 whose clocks change, and the ones beside them.
CHANGES = [
    date(2026, 3, 8),  # New York springs forward at 02:00
    date(2026, 11, 1),  # New York falls back at 02:00
    date(2026, 3, 29),  # Berlin springs forward at 02:00
    date(2026, 10, 25),  # Berlin falls back at 03:00
    date(2026, 4, 5),  # Sydney falls back
    date(2026, 10, 4),  # Sydney springs forward
]
days = st.one_of(
    st.sampled_from(CHANGES).flatmap(lambda d: st.integers(-1, 1).map(lambda k: d + timedelta(k))),
    st.dates(date(2026, 1, 1), date(2030, 12, 31)),
)
moments = st.datetimes(datetime(2026, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC))
EXPRESSIONS = [
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "30 1 * * *",
    "0 9 * * 1-5",
    "*/20 * * * * *",
    "@daily",
    "0 0 1 * *",
]


def ticks_on(cron: Cron, day: date) -> list[datetime]:
    """The ticks whose local date is `day`."""
    start = datetime.combine(day, time(0), cron.zone) - timedelta(microseconds=1)
    found, tick = [], cron.next_after(start)
    while tick.astimezone(cron.zone).date() == day:
        found.append(tick)
        tick = cron.next_after(tick)
    return found


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    day=days,
    hour=st.integers(0, 23),
    minute=st.integers(0, 59),
)
def test_a_daily_schedule_fires_once_every_day(
    zone: str, day: date, hour: int, minute: int
) -> None:
    """Also on the day a spring-forward skips its time and the day a fall-back repeats it."""
    cron = parse(f"{minute} {hour} * * *", zone, NOW)
    [tick] = ticks_on(cron, day)
    local = tick.astimezone(cron.zone)
    # At its time, or (in a spring-forward's gap) at the first moment after it.
    assert (local.hour, local.minute) >= (hour, minute)
    assert local - datetime.combine(day, time(hour, minute), cron.zone) <= timedelta(hours=1)


@pytest.mark.parametrize(
    ("zone", "day", "expression", "utc"),
    [
        ("Europe/Berlin", date(2026, 3, 29), "30 2 * * *", datetime(2026, 3, 29, 1, 0)),
        ("Europe/Berlin", date(2026, 10, 25), "30 2 * * *", datetime(2026, 10, 25, 0, 30)),
        ("America/New_York", date(2026, 3, 8), "30 2 * * *", datetime(2026, 3, 8, 7, 0)),
        ("America/New_York", date(2026, 11, 1), "30 1 * * *", datetime(2026, 11, 1, 5, 30)),
        ("America/New_York", date(2026, 11, 1), "30 2 * * *", datetime(2026, 11, 1, 7, 30)),
    ],
)
def test_the_daylight_saving_days_fire_at_these_moments(
    zone: str, day: date, expression: str, utc: datetime
) -> None:
    """A skipped 02:30 fires at 03:00 (the gap's end); a repeated one at its first occurrence."""
    assert ticks_on(parse(expression, zone, NOW), day) == [utc.replace(tzinfo=UTC)]


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("Europe/Berlin", date(2026, 3, 29), 23),
        ("Europe/Berlin", date(2026, 10, 25), 25),
        ("America/New_York", date(2026, 3, 8), 23),
        ("America/New_York", date(2026, 11, 1), 25),
        ("UTC", date(2026, 10, 25), 24),
    ],
)
def test_an_hourly_schedule_runs_on_real_time(zone: str, day: date, hours: int) -> None:
    """An hour field of `*` fires in both repeated hours of a fall-back: once an hour."""
    ticks = ticks_on(parse("0 * * * *", zone, NOW), day)
    assert len(ticks) == hours
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(ticks))


@settings(max_examples=200, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES), moment=moments)
def test_no_tick_falls_between_the_latest_and_the_next(
    expression: str, zone: str, moment: datetime
) -> None:
    cron = parse(expression, zone, NOW)
    latest, following = cron.latest_at(moment), cron.next_after(moment)
    assert latest <= moment < following
    assert cron.next_after(latest) == following
    assert cron.latest_at(following) == following
    assert cron.latest_at(following - timedelta(microseconds=1)) == latest


@settings(max_examples=200, deadline=None)
@given(
    expression=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    due_at=moments,
    late=st.floats(0, 10 * 86400),
    grace=st.floats(1, 3600),
)
def test_a_due_schedule_fires_for_its_latest_tick(
    expression: str, zone: str, due_at: datetime, late: float, grace: float
) -> None:
    """The tick is never in the future nor before the due one; earlier ticks count as missed
    exactly when a later one had come too."""
    cron = parse(expression, zone, NOW)
    due = cron.next_after(due_at)
    now = due + timedelta(seconds=late)
    fired = due_tick(cron, due, now, grace)
    assert due <= fired.tick <= now
    assert fired.skipped_earlier == (cron.next_after(due) <= now)
    assert fired.late == ((now - fired.tick).total_seconds() > grace)
    assert cron.next_after(now) > fired.tick


@pytest.mark.parametrize(
    "expression",
    ["61 * * * *", "* * *", "* * * * * * *", "0 0 31 2 *", "H * * * *", "every day", "", "x" * 201],
)
def test_a_bad_expression_is_refused_saying_why(expression: str) -> None:
    with pytest.raises(CronInvalid) as refused:
        parse(expression, "UTC", NOW)
    assert str(refused.value)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "", "Europe/Berlin " * 10])
def test_a_bad_zone_is_refused(zone: str) -> None:
    with pytest.raises(TimezoneInvalid):
        parse("* * * * *", zone, NOW)


def test_a_sixth_field_is_seconds_first() -> None:
    cron = parse("*/20 * * * * *", "UTC", NOW)
    assert cron.next_after(NOW) == NOW + timedelta(seconds=20)
    assert cron.zone == ZoneInfo("UTC")
