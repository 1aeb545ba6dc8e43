/**
 * A pasted script ("screenplay") as lines of the scene: one line per row, `Name: text` gives
 * the line to the character called Name. Pure, so it is tested without a page.
 *
 * Design choices:
 * - A row's speaker is what comes before its first ':' when that reads as a name: letters (and
 *   spaces, dots, apostrophes, hyphens between them), at most four words and `maxNameChars`
 *   characters, at the row's start; otherwise the whole row is the line's text (so "At 10:30 we
 *   sail." and "  (aside): …" stay text). Names match the cast case-insensitively; a new one joins the cast (with the default voice, which the
 *   director changes in the cast panel) in the order it first speaks.
 * - A row without a speaker is said by the speaker before it, like a paragraph continued in a
 *   screenplay; rows before any speaker have none (the scene's first character says them).
 * - Blank rows are skipped; text is trimmed; a text past `maxTextChars` is refused with its row,
 *   as the server would refuse it.
 */

export interface PastedLine {
  speaker: string | null; // a name as the cast spells it (or as written, for a new character)
  text: string;
}

export interface Screenplay {
  lines: PastedLine[];
  newNames: string[]; // speakers not in the cast, in the order they first speak
}

export interface ScreenplayLimits {
  maxNameChars: number;
  maxTextChars: number;
  maxLines: number; // how many more lines the script may take
  maxCast: number; // how many characters the cast may hold in all
}

const NAME = /^\p{L}[\p{L}\p{M} .'’-]*$/u;

/** The rows as lines, or a sentence saying what to change. */
export function parseScreenplay(text: string, cast: readonly string[], limits: ScreenplayLimits): Screenplay | string {
  const known = new Map(cast.map((name) => [name.toLowerCase(), name]));
  const newNames: string[] = [];
  const lines: PastedLine[] = [];
  let speaker: string | null = null;
  const rows = text.split(/\r?\n/);
  for (const [index, row] of rows.entries()) {
    if (row.trim() === "") continue;
    const colon = row.indexOf(":");
    const name = colon > 0 ? row.slice(0, colon).trim() : "";
    let said = row.trim();
    if (!/^\s/.test(row) && NAME.test(name) && name.length <= limits.maxNameChars && name.split(/\s+/).length <= 4) {
      said = row.slice(colon + 1).trim();
      const spelled = known.get(name.toLowerCase());
      if (spelled !== undefined) speaker = spelled;
      else {
        known.set(name.toLowerCase(), name);
        newNames.push(name);
        speaker = name;
      }
    }
    if (said === "") continue;
    if (said.length > limits.maxTextChars) {
      return `row ${index + 1} is ${said.length} characters; a line holds at most ${limits.maxTextChars}`;
    }
    lines.push({ speaker, text: said });
  }
  if (lines.length === 0) return "paste some lines first: one per row, 'Name: text' gives it to a character";
  if (lines.length > limits.maxLines) {
    return `that is ${lines.length} lines; the script has room for ${limits.maxLines} more`;
  }
  if (cast.length + newNames.length > limits.maxCast) {
    return `${newNames.length} new characters (${newNames.join(", ")}) would make the cast ${cast.length + newNames.length}; `
      + `it holds at most ${limits.maxCast}`;
  }
  return { lines, newNames };
}
