import { describe, expect, it } from "vitest";
import { parseScreenplay, type ScreenplayLimits } from "../../../frontend/src/studio/screenplay";

const LIMITS: ScreenplayLimits = { maxNameChars: 64, maxTextChars: 2000, maxLines: 1000, maxCast: 16 };

describe("a pasted script", () => {
  it("gives each row to the character named before its colon, matching the cast in any case", () => {
    const parsed = parseScreenplay("MARA: Who goes there?\n\nBo: A friend.\nNell:  Then come in. \n", ["Mara", "Bo"], LIMITS);
    expect(parsed).toEqual({
      lines: [{ speaker: "Mara", text: "Who goes there?" }, { speaker: "Bo", text: "A friend." },
        { speaker: "Nell", text: "Then come in." }],
      newNames: ["Nell"],
    });
  });

  it("keeps a row that does not start with a name as text, said by the speaker before it", () => {
    const parsed = parseScreenplay("The storm rises.\nMara: Who goes there?\nAt 10:30 we sail.\n  (aside): quietly", [], LIMITS);
    expect(parsed).toEqual({
      lines: [{ speaker: null, text: "The storm rises." }, { speaker: "Mara", text: "Who goes there?" },
        { speaker: "Mara", text: "At 10:30 we sail." }, { speaker: "Mara", text: "(aside): quietly" }],
      newNames: ["Mara"],
    });
  });

  it("reads names with accents, spaces, dots and apostrophes, but not sentences", () => {
    const parsed = parseScreenplay("Dr. O'Neil: Sit.\nJosé María: Thanks.\nThis is far too long a name: no", [], LIMITS);
    expect(parsed).toEqual({
      lines: [{ speaker: "Dr. O'Neil", text: "Sit." }, { speaker: "José María", text: "Thanks." },
        { speaker: "José María", text: "This is far too long a name: no" }],
      newNames: ["Dr. O'Neil", "José María"],
    });
  });

  it("says what to change when the script, the cast or a line would be too big, or nothing was pasted", () => {
    expect(parseScreenplay(" \n\n", [], LIMITS)).toBe("paste some lines first: one per row, 'Name: text' gives it to a character");
    expect(parseScreenplay("a\nb\nc", [], { ...LIMITS, maxLines: 2 })).toBe("that is 3 lines; the script has room for 2 more");
    expect(parseScreenplay("A: x\nB: y", ["Mara"], { ...LIMITS, maxCast: 2 }))
      .toBe("2 new characters (A, B) would make the cast 3; it holds at most 2");
    expect(parseScreenplay(`Mara: ${"x".repeat(11)}`, [], { ...LIMITS, maxTextChars: 10 }))
      .toBe("row 1 is 11 characters; a line holds at most 10");
  });
});
