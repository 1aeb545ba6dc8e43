/** Tiny DOM helpers: the studio builds its elements with `h()` and updates them in place. */

type Child = Node | string | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | undefined>;

/** `h("button.primary", {onclick}, "Take")`: tag with optional .classes, attributes, children. */
export function h<K extends keyof HTMLElementTagNameMap>(spec: K | `${K}.${string}`, attrs: Attrs = {},
                                                        ...children: Child[]): HTMLElementTagNameMap[K] {
  const [tag, ...classes] = spec.split(".") as [K, ...string[]];
  const el = document.createElement(tag);
  if (classes.length > 0) el.className = classes.join(" ");
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (typeof value === "function") el.addEventListener(key.replace(/^on/, ""), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  for (const child of children) if (child !== null && child !== undefined && child !== false) el.append(child);
  return el;
}

/** Set text only when it changed (keeps selection and avoids layout work at 20 Hz). */
export function setText(el: Element, text: string): void {
  if (el.textContent !== text) el.textContent = text;
}

export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`the page has no #${id}`);
  return el as T;
}

export const ms = (value: number | null | undefined): string =>
  value === null || value === undefined || !Number.isFinite(value) ? "—" : `${Math.round(value)} ms`;

export const seconds = (samples: number, rate: number): string => `${(samples / rate).toFixed(2)} s`;

/** Save `data` as a file through a temporary link (the browser's download). */
export function download(name: string, data: ArrayBuffer, type = "audio/wav"): void {
  const url = URL.createObjectURL(new Blob([data], { type }));
  const link = h("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** Move `views` into `parent` in order, reusing nodes (focus and canvases survive). */
export function placeChildren(parent: Element, nodes: readonly Element[]): void {
  nodes.forEach((node, k) => {
    if (parent.children[k] !== node) parent.insertBefore(node, parent.children[k] ?? null);
  });
  while (parent.children.length > nodes.length) parent.lastElementChild!.remove();
}
