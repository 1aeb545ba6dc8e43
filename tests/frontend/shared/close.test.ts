import { describe, expect, it } from "vitest";
import { closeWords } from "../../../frontend/src/shared/close";

describe("close codes in words", () => {
  it.each([1000, 1001, 1005, 1006, 1008, 1009, 1011, 1012, 1013, 1015, 4000, 4001])("says what %i means without the bare code", (code) => {
    const words = closeWords(code);
    expect(words).not.toMatch(/\d{4}/);
    expect(words.length).toBeGreaterThan(10);
  });

  it("tells the codes apart", () => {
    const all = [1000, 1001, 1005, 1006, 1008, 1009, 1011, 1012, 1013, 1015, 4000, 4001].map((code) => closeWords(code));
    expect(new Set(all).size).toBe(all.length);
  });

  it("adds the server's reason, once", () => {
    expect(closeWords(1008, "too many protocol errors")).toBe(
      "the server refused this page (check the ?token= in the address, or the page's origin): too many protocol errors");
    expect(closeWords(1006, "  ")).toBe("the connection was lost: the server stopped or the network dropped");
  });

  it("still says something for a code it does not know", () => {
    expect(closeWords(4999)).toBe("the connection closed (code 4999)");
  });
});
