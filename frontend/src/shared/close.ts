/**
 * A WebSocket close in words a director reads: what happened and what to do, never a bare
 * code. Both pages show it (the studio's connection status and offline banner, the
 * conversation page's error line).
 *
 * Design choices:
 * - The codes are the ones a browser can see from `retake serve` (docs/protocol.md §1 and §9:
 *   1000, 1001, 1008, 1009, 1011, 1012, 1013), from the network (1006, 1015) and from the
 *   studio's own socket (4000 silent too long, 4001 reconnect asked for). Any other code
 *   still gets a sentence, with the code at the end for a bug report.
 * - The server's reason, when it gave one, follows the sentence: it says the specific
 *   thing (which limit, which token) that the code only classifies.
 */

const CLOSE_WORDS: Record<number, string> = {
  1000: "the server closed the connection",
  1001: "the server is shutting down",
  1005: "the connection closed without a reason",
  1006: "the connection was lost: the server stopped or the network dropped",
  1008: "the server refused this page (check the ?token= in the address, or the page's origin)",
  1009: "a message was too big for the server",
  1011: "the server hit an internal error",
  1012: "the server is restarting",
  1013: "the server is full right now; it takes no more connections until one closes",
  1015: "the secure connection (TLS) failed",
  4000: "no word from the server for 30 s",
  4001: "reconnecting, as asked",
};

/** `code` and the server's `reason` as one sentence, without a trailing period. */
export function closeWords(code: number, reason = ""): string {
  const words = CLOSE_WORDS[code] ?? `the connection closed (code ${code})`;
  const said = reason.trim();
  return said === "" || words.includes(said) ? words : `${words}: ${said}`;
}
