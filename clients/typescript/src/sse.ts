/**
 * Server-sent events read from a `fetch` body (EventSource cannot send an API key), parsed as
 * the WHATWG event-stream format says: `\n`, `\r\n` or `\r` line ends, `:` comments, the
 * fields `event`, `data` (joined by newlines), `id` and `retry`.
 */

/** One dispatched frame. `id` is the frame's own `id:` field, null when it had none: unlike
 * EventSource, a frame never inherits an earlier id, so a control frame moves no cursor. */
export interface SseFrame {
  event: string;
  data: string;
  id: string | null;
  retry: number | null;
}

export class SseParser {
  private buffer = "";
  private pendingCr = false;
  private event = "";
  private data: string[] = [];
  private id: string | null = null;
  private retry: number | null = null;

  /** The frames completed by `text` (the next piece of the decoded body). */
  feed(text: string): SseFrame[] {
    const frames: SseFrame[] = [];
    if (text === "") return frames; // an empty piece must not forget a `\r` that ended the last
    let input = text;
    if (this.pendingCr && input.startsWith("\n")) input = input.slice(1); // `\r\n` split in two
    this.pendingCr = false;
    this.buffer += input;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i += 1) {
      const char = this.buffer[i];
      if (char !== "\n" && char !== "\r") continue;
      const frame = this.line(this.buffer.slice(start, i));
      if (frame !== null) frames.push(frame);
      if (char === "\r") {
        if (i + 1 === this.buffer.length) this.pendingCr = true;
        else if (this.buffer[i + 1] === "\n") i += 1;
      }
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
    return frames;
  }

  private line(line: string): SseFrame | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null; // a comment: `: ping`
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    else if (name === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }

  private dispatch(): SseFrame | null {
    const frame: SseFrame = {
      event: this.event || "message",
      data: this.data.join("\n"),
      id: this.id,
      retry: this.retry,
    };
    const empty = this.data.length === 0;
    this.event = "";
    this.data = [];
    this.id = null;
    this.retry = null;
    return empty ? null : frame; // the `retry:` block alone dispatches nothing
  }
}
