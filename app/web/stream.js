// One SSE stream that stays open. EventSource reconnects by itself after a network error or a
// stream the server ended (a restart), sending Last-Event-ID; an HTTP error answer closes it for
// good, so then `onClosed` decides (ask for a key, give up) or this reopens it after a backoff
// from `cursor()`, where the page's fold is (an event's seq, or `<seq>.<chunk>` mid-turn; ids
// are strings, never parsed here). Nothing is missed or repeated: the server resumes after that
// id (a token delta's id too) and the folds ignore what they already hold.

export class EventStream {
  // url(cursor) -> the stream's URL; types: the event names to listen to;
  // onFrame(type, envelope); onState('connecting' | 'live' | 'reconnecting' | 'closed');
  // onClosed() -> a promise of true to reopen, false to stay closed.
  constructor({url, types, cursor, onFrame, onState = () => {}, onClosed = async () => true}) {
    Object.assign(this, {url, types, cursor, onFrame, onState, onClosed});
    this.source = null;
    this.stopped = false;
    this.failures = 0;
    this.timer = null;
  }

  open() {
    this.stopped = false;
    this.onState('connecting');
    const source = new EventSource(this.url(this.cursor()));
    this.source = source;
    source.onopen = () => { this.failures = 0; };
    source.onerror = () => {
      if (source !== this.source) return;
      if (source.readyState === EventSource.CLOSED) this.closed();
      else this.onState('reconnecting');
    };
    const listen = (type, handler) => source.addEventListener(type, (message) => {
      if (source !== this.source) return;
      let envelope;
      try { envelope = JSON.parse(message.data); } catch { return; }
      handler(type, envelope);
    });
    for (const type of this.types) listen(type, (t, e) => this.onFrame(t, e));
    listen('caught_up', (t, e) => { this.onState('live'); this.onFrame(t, e); });
    listen('resync_required', (t, e) => { this.onFrame(t, e); });
  }

  async closed() {
    this.source?.close();
    this.source = null;
    if (this.stopped) return;
    this.onState('closed');
    const again = await this.onClosed();
    if (!again || this.stopped) return;
    this.failures += 1;
    const delay = Math.min(10000, 500 * 2 ** Math.min(this.failures, 5));
    this.onState('reconnecting');
    this.timer = setTimeout(() => { if (!this.stopped) this.open(); }, delay);
  }

  // Reopen at once from `cursor()` (after a resync, or a new key).
  restart() {
    this.stop();
    this.open();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.source?.close();
    this.source = null;
  }
}
