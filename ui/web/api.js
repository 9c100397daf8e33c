// Calls to the agent's HTTP API (ui/API.md): auth header on every call, problem+json errors
// turned into exceptions, and the parameters shared by the profile routes.

import { authHeaders, requestToken } from './auth.js';

/** A call the API answered with an error; `detail` is the problem's own explanation. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

/** The API wants a token (HTTP 401); the token dialog is open. */
export class AuthRequired extends ApiError {}

/**
 * The call-tree nodes a flame graph asks for (`max_nodes`): more than a screen can show, few enough
 * that a range with millions of distinct stacks still answers in about a second.
 */
export const MAX_NODES = 65536;

/** `path?k=v…`, leaving out empty parameters. */
export function apiUrl(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== '' && value !== null && value !== undefined) query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** The response of a call, or an `ApiError`. */
export async function request(path, params, { method = 'GET', signal } = {}) {
  const response = await fetch(apiUrl(path, params), { method, headers: authHeaders(), signal });
  if (response.ok) return response;
  const problem = await response.json().catch(() => ({}));
  const detail = problem.detail || `${response.status} ${response.statusText}`;
  if (response.status === 401) {
    requestToken(`The agent asks for a token: ${detail}`);
    throw new AuthRequired(401, 'The API needs a token: enter it to see data.');
  }
  throw new ApiError(response.status, detail);
}

export async function getJson(path, params, options) {
  return (await request(path, params, options)).json();
}

/**
 * A function that returns a fresh AbortSignal each call and aborts the previous one, so that a
 * view only ever shows the answer to the last thing the user asked for.
 */
export function latestOnly() {
  let controller = null;
  return () => {
    controller?.abort();
    controller = new AbortController();
    return controller.signal;
  };
}

/** Whether `error` is an abort by `latestOnly` (not worth showing). */
export function isAbort(error) {
  return error?.name === 'AbortError';
}

const quote = (value) => `"${value.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;

/** The series selector of the state's filters: `{service_name="api",process_id="42",…}`. */
function selector(state) {
  const matchers = [];
  if (state.service) matchers.push(['service_name', state.service]);
  if (state.pid) matchers.push(['process_id', state.pid]);
  for (const label of state.labels) {
    const at = label.indexOf('=');
    matchers.push([label.slice(0, at), label.slice(at + 1)]);
  }
  return matchers.length ? `{${matchers.map(([k, v]) => `${k}=${quote(v)}`).join(',')}}` : '';
}

/** What every profile route takes from the state: type, selector, trace and span filters. */
export function profileParams(state) {
  return {
    type: state.type,
    query: selector(state),
    span_id: state.span_id.trim(),
    trace_id: state.trace_id.trim(),
  };
}
