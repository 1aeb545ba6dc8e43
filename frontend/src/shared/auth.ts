/**
 * The server's token (`retake serve --token`), for pages: give it once in the address as
 * `#token=TOKEN` (or the older `?token=TOKEN`); the page trades it for an HttpOnly cookie
 * (`POST /auth`, the token in a header) and takes it out of the address bar. Browsers then
 * send the cookie with the page's sockets and fetches, so the token never travels in a URL
 * (where access logs and browser history would keep it). docs/protocol.md §1.
 */
export async function tradeToken(): Promise<void> {
  const url = new URL(location.href);
  const hash = new URLSearchParams(url.hash.slice(1));
  const token = hash.get("token") ?? url.searchParams.get("token");
  if (token === null) return;
  hash.delete("token");
  url.searchParams.delete("token");
  url.hash = hash.toString();
  history.replaceState(history.state, "", url);
  try {
    await fetch(new URL("/auth", location.href), { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  } catch {
    // The socket's refusal says what went wrong (the page shows it).
  }
}
