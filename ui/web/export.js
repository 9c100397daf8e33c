// Export of what is shown: links to the API's own files for the current selection (a profile,
// or in compare mode the diff). The links are real URLs (copy one for curl), but a click
// downloads through `request`, so that the token goes along when auth is on.

import { apiUrl, request } from './api.js';
import { h } from './dom.js';

const FORMATS = [
  { format: 'pprof', extension: 'pb.gz', label: 'pprof' },
  { format: 'folded', extension: 'folded', label: 'folded' },
  { format: 'speedscope', extension: 'speedscope.json', label: 'speedscope' },
  { format: 'svg', extension: 'svg', label: 'SVG' },
];
/** The formats `/api/v1/diff` writes: both sides of a comparison need a format that holds two. */
const DIFF_FORMATS = ['pprof', 'folded'];

export class Export {
  /** @param {(error: Error) => void} onError shows a failed download */
  constructor(host, onError) {
    this.onError = onError;
    this.links = FORMATS.map((f) =>
      h('a', { className: 'export-link', dataset: { format: f.format }, onclick: (e) => this.download(e, f) }, f.label),
    );
    host.replaceChildren('Export:', ...this.links);
  }

  /**
   * Points the links at `path` (`/api/v1/profile` or `/api/v1/diff`) with `params`; `name` is
   * the downloaded file's name without extension.
   */
  update(path, params, name) {
    this.target = { path, params, name };
    for (const [k, link] of this.links.entries()) {
      const { format } = FORMATS[k];
      const offered = path !== '/api/v1/diff' || DIFF_FORMATS.includes(format);
      link.classList.toggle('disabled', !offered);
      link.title = offered ? `Download ${FORMATS[k].label}` : 'The diff is offered as pprof (sample types base and new) and folded only';
      if (offered) link.href = apiUrl(path, { ...params, format });
      else link.removeAttribute('href');
    }
  }

  async download(event, { format, extension }) {
    event.preventDefault();
    if (!this.target || event.currentTarget.classList.contains('disabled')) return;
    const { path, params, name } = this.target;
    try {
      const blob = await (await request(path, { ...params, format })).blob();
      const url = URL.createObjectURL(blob);
      h('a', { href: url, download: `${name}.${extension}` }).click();
      // The browser has taken the blob once the click has run; free it afterwards.
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      this.onError(error);
    }
  }
}
