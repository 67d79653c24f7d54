// Calls to this server's own API, with the key the page keeps (localStorage) when one is set.

const KEY_NAME = "mlx-serve.api-key";

export class Unauthorized extends Error {}

export function apiKey() {
  return localStorage.getItem(KEY_NAME) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_NAME, key);
  else localStorage.removeItem(KEY_NAME);
}

// fetch() with `Authorization: Bearer <key>`; a 401 raises Unauthorized so the page can ask once.
export async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...init, headers, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized(await errorText(response));
  return response;
}

export async function getJSON(path) {
  const response = await api(path);
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

// The message of an error body in OpenAI's or Anthropic's shape, else the status line.
export async function errorText(response) {
  try {
    const body = await response.json();
    const message = body?.error?.message;
    if (message) return message;
  } catch {
    // not JSON
  }
  return `${response.status} ${response.statusText}`;
}
