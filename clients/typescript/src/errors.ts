/**
 * The client's errors, as the Python SDK's (clients/python/src/ferryman/errors.py):
 * `FerrymanError` (one subclass per status family) for a problem+json answer, and
 * `FerrymanConnectionError` when no answer came at all.
 */

import type { components } from "./openapi.js";

export type Problem = components["schemas"]["Problem"];
export type ProblemCode = components["schemas"]["ProblemCode"];

/** One entry of a 422's `errors`: the field (dotted, camelCase as sent) and what is wrong. */
export interface FieldError {
  field: string;
  message: string;
  type: string;
}

// A proxy's error page can be long; the message keeps its start.
const MAX_DETAIL_CHARS = 1000;

/** An error answer (4xx/5xx) of the Ferryman API, from its problem+json body. */
export class FerrymanError extends Error {
  readonly status: number;
  /** The stable code (`SESSION_NOT_FOUND`, ...); `HTTP_<status>` for a body without one. */
  readonly code: ProblemCode | string;
  readonly title: string;
  readonly detail: string;
  readonly errors: FieldError[];
  /** The answer's body as it came (a proxy's page becomes `{detail}`). */
  readonly problem: Record<string, unknown>;

  constructor(status: number, problem: Record<string, unknown>) {
    const code = typeof problem.code === "string" && problem.code ? problem.code : `HTTP_${status}`;
    const title = typeof problem.title === "string" && problem.title ? problem.title : "Error";
    const detail = typeof problem.detail === "string" ? problem.detail : "";
    const errors = fieldErrors(problem.errors);
    super(message(status, code, detail || title, errors));
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.title = title;
    this.detail = detail;
    this.errors = errors;
    this.problem = problem;
  }

  /** Whether the same request may succeed later (429, 5xx). */
  get retryable(): boolean {
    return this.status === 429 || this.status >= 500;
  }
}

/** 400: a malformed body, cursor or page token. */
export class BadRequestError extends FerrymanError {}
/** 401: no API key, or one the server does not know. */
export class AuthenticationError extends FerrymanError {}
/** 403: e.g. a local-mode request that is not local (LOCAL_MODE_NOT_LOCAL). */
export class PermissionDeniedError extends FerrymanError {}
/** 404: no such session for this owner (also another owner's, or a deleted one). */
export class NotFoundError extends FerrymanError {}
/** 409: e.g. SESSION_ALREADY_TERMINAL, IDEMPOTENCY_KEY_REUSED, APPROVAL_NOT_PENDING. */
export class ConflictError extends FerrymanError {}
/** 413: the body is over the server's FERRYMAN_MAX_BODY_BYTES. */
export class PayloadTooLargeError extends FerrymanError {}
/** 415: the body is not JSON. */
export class UnsupportedMediaTypeError extends FerrymanError {}
/** 422 VALIDATION_ERROR: `errors` names each field at fault. */
export class UnprocessableEntityError extends FerrymanError {}
/** 429: e.g. TOO_MANY_STREAMS; retry later. */
export class RateLimitError extends FerrymanError {}
/** 5xx other than 503. */
export class InternalServerError extends FerrymanError {}
/** 503: e.g. DATABASE_UNAVAILABLE; retry shortly. */
export class ServiceUnavailableError extends FerrymanError {}

type ErrorClass = new (status: number, problem: Record<string, unknown>) => FerrymanError;

const BY_STATUS: Record<number, ErrorClass> = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  415: UnsupportedMediaTypeError,
  422: UnprocessableEntityError,
  429: RateLimitError,
  503: ServiceUnavailableError,
};

export function errorClass(status: number): ErrorClass {
  return BY_STATUS[status] ?? (status >= 500 ? InternalServerError : FerrymanError);
}

/** The error for a 4xx/5xx answer: problem+json, or (from a proxy) anything else, whose text
 * becomes the detail. */
export async function apiError(response: Response): Promise<FerrymanError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // A body cut off: the status still says what happened.
  }
  const ErrorType = errorClass(response.status);
  return new ErrorType(response.status, problemOf(text));
}

function problemOf(text: string): Record<string, unknown> {
  try {
    const body: unknown = JSON.parse(text);
    if (body !== null && typeof body === "object" && !Array.isArray(body)) {
      return body as Record<string, unknown>;
    }
  } catch {
    // not JSON: a proxy's page
  }
  return { detail: text.trim().slice(0, MAX_DETAIL_CHARS) };
}

function fieldErrors(raw: unknown): FieldError[] {
  if (!Array.isArray(raw)) return [];
  return raw
    .filter((e): e is Record<string, unknown> => e !== null && typeof e === "object")
    .map((e) => ({ field: String(e.field ?? ""), message: String(e.message ?? ""), type: String(e.type ?? "") }));
}

function message(status: number, code: string, head: string, errors: FieldError[]): string {
  // Each field at fault, unless the detail already names it (newer servers do).
  const named = errors.map(fieldText).filter((text) => !head.includes(text));
  return [`${status} ${code}: ${head}`, ...named].join("; ");
}

function fieldText(error: FieldError): string {
  return error.field ? `${error.field}: ${error.message}` : error.message;
}

/** The server could not be reached (refused, unresolvable, timed out, cut mid-answer). */
export class FerrymanConnectionError extends Error {
  readonly baseUrl: string;
  readonly reason: string;

  constructor(baseUrl: string, reason: string, options?: { cause?: unknown }) {
    super(`cannot reach Ferryman at ${baseUrl}: ${reason}; is \`ferryman serve\` running? (FERRYMAN_URL)`, options);
    this.name = "FerrymanConnectionError";
    this.baseUrl = baseUrl;
    this.reason = reason;
  }
}

/** A short reason for a failed fetch: the innermost cause's code or message. */
export function connectionReason(error: unknown): string {
  let seen: unknown = error;
  let reason = "connection failed";
  for (let depth = 0; seen instanceof Error && depth < 5; depth += 1) {
    const code = (seen as { code?: unknown }).code;
    reason = typeof code === "string" ? code : seen.message || seen.name;
    seen = seen.cause;
  }
  return reason;
}
