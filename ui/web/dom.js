// Building DOM nodes. Function, type and service names come from the profiled processes, so
// they only ever become text nodes (never HTML): `h` takes children as nodes or strings.

/** `h('td', {className: 'num', title: 'x'}, 'text', childNode)`: an element with properties. */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(element.dataset, value);
    else element[key] = value;
  }
  element.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return element;
}

export function byId(id) {
  const element = document.getElementById(id);
  if (!element) throw new Error(`index.html has no #${id}`);
  return element;
}

/** Shows `content` (nodes or strings) in the page's one tooltip, near the pointer. */
export function showTooltip(event, ...content) {
  const tip = byId('tooltip');
  tip.replaceChildren(...content);
  tip.hidden = false;
  // Keep it inside the window: flip to the pointer's left or top near the edges.
  const { innerWidth, innerHeight } = window;
  const box = tip.getBoundingClientRect();
  const x = event.clientX + 14 + box.width > innerWidth ? event.clientX - box.width - 8 : event.clientX + 14;
  const y = event.clientY + 16 + box.height > innerHeight ? event.clientY - box.height - 8 : event.clientY + 16;
  tip.style.left = `${Math.max(0, x)}px`;
  tip.style.top = `${Math.max(0, y)}px`;
}

export function hideTooltip() {
  byId('tooltip').hidden = true;
}

/**
 * A canvas sized to `width` × `height` CSS pixels at the screen's pixel ratio, so that lines
 * and text stay sharp; returns its 2D context scaled to CSS pixels.
 */
export function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.max(1, Math.round(width * ratio));
  canvas.height = Math.max(1, Math.round(height * ratio));
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const context = canvas.getContext('2d');
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  return context;
}
