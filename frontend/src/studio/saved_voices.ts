/**
 * The server's saved voices (`GET /v1/audio/voices`, docs/protocol.md §8.1): the voices the speech
 * API's `voice` names, which can join a scene's cast (`cast.set` with `voice.saved_voice`).
 *
 * Design choices:
 * - Listed when the cast editor opens, never cached: another client may have saved one since.
 * - The answer is checked field by field, like the socket's messages (shared/wire.ts).
 */
import { list, nullable, record, str, type Check } from "../shared/wire";

export interface SavedVoice {
  id: string;
  name: string;
  references: { text: string }[];
  character: { name: string; description: string; scene: string | null } | null;
}

const savedVoice: Check<SavedVoice> = record<SavedVoice>({
  id: str, name: str, references: list(record({ text: str })),
  character: nullable(record({ name: str, description: str, scene: nullable(str) })),
});

/** The saved voices, oldest first; a message in words when they cannot be had. */
export async function listSavedVoices(): Promise<SavedVoice[] | string> {
  try {
    const reply = await fetch(new URL("/v1/audio/voices", location.href));
    if (!reply.ok) return `the server's saved voices could not be listed (HTTP ${reply.status})`;
    return record({ data: list(savedVoice) })(await reply.json(), "voices").data;
  } catch {
    return "the server's saved voices could not be listed (no answer)";
  }
}

/** A saved voice in words: "2 clips: “Hello there.” …" or "described: a cheerful baker". */
export function savedVoiceSummary(voice: SavedVoice): string {
  if (voice.character !== null) return `described: ${voice.character.description}`;
  const n = voice.references.length;
  return `${n} clip${n === 1 ? "" : "s"}: ${voice.references.map((r) => `“${r.text}”`).join(" ")}`;
}
