// Numbers as people read them: profile values in their unit, shares, times of day.

const NANOSECOND_STEPS = [
  [60e9, 'min'],
  [1e9, 's'],
  [1e6, 'ms'],
  [1e3, 'µs'],
  [1, 'ns'],
];
const BYTE_STEPS = [
  [2 ** 30, 'GiB'],
  [2 ** 20, 'MiB'],
  [2 ** 10, 'KiB'],
  [1, 'B'],
];
const COUNT_STEPS = [
  [1e9, 'G'],
  [1e6, 'M'],
  [1e3, 'k'],
  [1, ''],
];

function scaled(value, steps, space) {
  const magnitude = Math.abs(value);
  const [size, suffix] = steps.find(([s]) => magnitude >= s) ?? steps[steps.length - 1];
  const number = value / size;
  const digits = size === 1 || Math.abs(number) >= 100 ? 0 : Math.abs(number) >= 10 ? 1 : 2;
  return `${number.toFixed(digits)}${suffix ? space + suffix : ''}`;
}

/** A value of a profile type in its unit (`nanoseconds`, `bytes`, or a count). */
export function formatValue(value, unit) {
  if (unit === 'nanoseconds') return scaled(value, NANOSECOND_STEPS, ' ');
  if (unit === 'bytes') return scaled(value, BYTE_STEPS, ' ');
  return scaled(value, COUNT_STEPS, '');
}

/** A fraction as a percentage with enough digits to tell small shares apart. */
export function formatPercent(fraction) {
  const percent = fraction * 100;
  if (!Number.isFinite(percent)) return '–';
  const digits = percent === 0 || Math.abs(percent) >= 10 ? 1 : Math.abs(percent) >= 0.1 ? 2 : 3;
  return `${percent.toFixed(digits)}%`;
}

/** A change of share in percentage points, signed. */
export function formatPoints(fraction) {
  const points = fraction * 100;
  return `${points >= 0 ? '+' : '−'}${Math.abs(points).toFixed(2)} pts`;
}

const pad = (n) => String(n).padStart(2, '0');

/** Unix milliseconds as local `HH:MM:SS`, or `HH:MM` when `short`. */
export function formatClock(unixMs, short = false) {
  const d = new Date(unixMs);
  const clock = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return short ? clock : `${clock}:${pad(d.getSeconds())}`;
}

/** Unix milliseconds as local `YYYY-MM-DD HH:MM:SS`. */
export function formatDateTime(unixMs) {
  const d = new Date(unixMs);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${formatClock(unixMs)}`;
}

/** A length of time in milliseconds: `90 s`, `5 min`, `2 h 30 min`. */
export function formatSpan(ms) {
  const seconds = Math.round(ms / 1000);
  if (seconds < 120) return `${seconds} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 120) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  return minutes % 60 ? `${hours} h ${minutes % 60} min` : `${hours} h`;
}

/** A range of Unix milliseconds, for captions. */
export function formatRange({ from, until }) {
  const sameDay = new Date(from).toDateString() === new Date(until).toDateString();
  const show = sameDay ? formatClock : formatDateTime;
  return `${show(from)} – ${show(until)} (${formatSpan(until - from)})`;
}
