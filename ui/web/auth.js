// The API token. When the agent has authentication on, every API call carries
// `Authorization: Bearer TOKEN`; the token is typed once per browser session and kept in
// sessionStorage, so it is gone when the tab closes and never written to disk by the page.
// A 401 from any call opens the token dialog; saving a token tells the listeners to load again.

import { byId } from './dom.js';

const KEY = 'clrscope.token';
const listeners = [];

function token() {
  return sessionStorage.getItem(KEY) ?? '';
}

/** The headers every API call sends. */
export function authHeaders() {
  const value = token();
  return value ? { Authorization: `Bearer ${value}` } : {};
}

/** Calls `listener()` when the token is set or cleared. */
export function onTokenChange(listener) {
  listeners.push(listener);
}

/** Opens the token dialog (if not open yet), saying why: the API refused a call. */
export function requestToken(reason) {
  const dialog = byId('token-dialog');
  byId('token-reason').textContent = reason;
  if (!dialog.open) dialog.showModal();
}

function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
  byId('token-button').textContent = value ? 'Token ✓' : 'Token';
  for (const listener of listeners) listener();
}

/** Wires the dialog and the header's Token button. */
export function setupTokenDialog() {
  const dialog = byId('token-dialog');
  const input = byId('token-input');
  byId('token-button').textContent = token() ? 'Token ✓' : 'Token';
  byId('token-button').addEventListener('click', () => {
    byId('token-reason').textContent = 'The bearer token the agent was configured with.';
    dialog.showModal();
  });
  dialog.addEventListener('close', () => {
    input.value = '';
  });
  byId('token-form').addEventListener('submit', (event) => {
    // The page handles the form itself: no navigation (the page's CSP allows no form action).
    event.preventDefault();
    const value = input.value.trim();
    dialog.close();
    if (value) setToken(value);
  });
  byId('token-clear').addEventListener('click', () => {
    dialog.close();
    setToken('');
  });
}
