(() => {
// The GUI env's page script (clawloop/envs/gui/env.py installs it in every MiniWoB++ page as the body of
// `() => ...`): window.__cl collects the visible elements and tags each with a stable data-cl-ref, starts
// the episode the way miniwob does, acts on refs and waits for the page to settle. The episode's time
// limit below is filled in by env.page_script() (EPISODE_TIME_MS).
if (window.__cl) return true;
const SKIP_IDS = new Set(['reward-display', 'sync-task-cover', 'click-canvas', 'attention-canvas', 'query']);
const SKIP_TAGS = new Set(['SCRIPT', 'STYLE', 'BR', 'HEAD', 'META', 'LINK', 'NOSCRIPT', 'TEMPLATE', 'TITLE',
                           'DEFS', 'CLIPPATH', 'LINEARGRADIENT', 'RADIALGRADIENT', 'STOP']);
const SHAPES = new Set(['rect', 'circle', 'ellipse', 'polygon', 'polyline', 'path', 'line', 'text', 'image']);
const ROLES = new Set(['link', 'button', 'checkbox', 'radio', 'input', 'select', 'textarea', 'option', 'tab',
  'menuitem', 'treeitem', 'slider', 'spinbutton', 'switch', 'combobox', 'listbox', 'textbox', 'gridcell']);
const SPECIAL_INPUTS = new Set(['date', 'time', 'datetime-local', 'month', 'week', 'color', 'range']);
const pending = new Set();
const _st = window.setTimeout, _ct = window.clearTimeout;
window.setTimeout = function (fn, ms) {
  const args = Array.prototype.slice.call(arguments, 2), d = Number(ms) || 0;
  if (d > 3000) return _st.apply(window, arguments);
  let id = null;
  id = _st.call(window, function () {
    pending.delete(id);
    return typeof fn === 'function' ? fn.apply(window, args) : (0, eval)(String(fn));
  }, d);
  pending.add(id);
  return id;
};
window.clearTimeout = function (id) { pending.delete(id); return _ct.call(window, id); };
let next = 1;
const collapse = (s) => String(s == null ? '' : s).replace(/\s+/g, ' ').trim();
const cut = (s, n) => s.length > n ? s.slice(0, n - 1) + '\u2026' : s;
function clsOf(el) {
  const c = el.className;
  return collapse(typeof c === 'string' ? c : (c && c.baseVal) || '');
}
function isVisible(el) {
  if (!el.isConnected) return false;
  const r = el.getBoundingClientRect();
  if (r.width <= 0 || r.height <= 0) return false;
  if (el.checkVisibility) return el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const cs = getComputedStyle(el);
  return cs.visibility !== 'hidden' && cs.display !== 'none' && Number(cs.opacity) !== 0;
}
function roleOf(el, tag) {
  if (tag === 'a') return 'link';
  if (tag === 'button') return 'button';
  if (tag === 'input') {
    const t = (el.type || 'text').toLowerCase();
    if (['button', 'submit', 'reset', 'image'].includes(t)) return 'button';
    if (t === 'checkbox' || t === 'radio') return t;
    return 'input';
  }
  if (tag === 'select' || tag === 'textarea' || tag === 'option') return tag;
  const role = el.getAttribute('role');
  if (role) return role;
  if (el instanceof SVGElement && tag !== 'svg') return 'svg ' + tag;
  return tag;
}
function ownText(el) {
  let s = '';
  for (const n of el.childNodes) if (n.nodeType === 3) s += ' ' + n.data;
  return collapse(s);
}
function textOf(el) {
  if (el instanceof SVGElement) return collapse(el.textContent);
  return collapse(el.innerText !== undefined ? el.innerText : el.textContent);
}
function isControl(el) { return el.matches && el.matches('input,select,textarea,button'); }
function labelOf(el) {
  if (el.labels && el.labels.length) {
    const l = el.labels[0], c = l.cloneNode(true);
    c.querySelectorAll('select').forEach((s) => s.remove());
    const t = collapse(c.textContent);
    if (t) return t;
  }
  const a = el.getAttribute('aria-label') || el.getAttribute('placeholder') || el.getAttribute('title');
  if (a) return collapse(a);
  let p = el.previousElementSibling;
  if (p && !isControl(p)) { const t = textOf(p); if (t && t.length <= 40) return t; }
  let n = el.previousSibling;
  while (n && n.nodeType === 3 && !n.data.trim()) n = n.previousSibling;
  if (n && n.nodeType === 3) { const t = collapse(n.data); if (t.length <= 40) return t; }
  let cell = el.parentElement;
  for (let i = 0; i < 2 && cell; i++, cell = cell.parentElement) {
    if (cell.querySelectorAll('input,select,textarea').length !== 1) break;
    const prev = cell.previousElementSibling;
    if (prev && !prev.querySelector('input,select,textarea')) {
      const t = textOf(prev); if (t && t.length <= 40) return t;
    }
  }
  p = el.nextElementSibling;
  if (p && !isControl(p)) { const t = textOf(p); if (t && t.length <= 40) return t; }
  return '';
}
function interactive(el, tag, role) {
  if (ROLES.has(role)) return true;
  if (el.hasAttribute('onclick') || (el.hasAttribute('tabindex') && el.tabIndex >= 0)) return true;
  if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return true;
  if (/(^|\s)(ui-button|ui-menu-item|ui-state-default|hitarea)(\s|$)/.test(clsOf(el))) return true;
  try {
    if (getComputedStyle(el).cursor === 'pointer' &&
        !(el.parentElement && getComputedStyle(el.parentElement).cursor === 'pointer')) return true;
  } catch (e) {}
  return false;
}
function record(el, ref, depth, parents) {
  const tag = el.tagName.toLowerCase(), role = roleOf(el, tag), vis = isVisible(el);
  const r = el.getBoundingClientRect();
  const rec = {ref: ref, tag: tag, role: role, visible: vis, depth: depth, parents: parents,
               rect: [Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)]};
  if (el.id) rec.id = el.id;
  const cls = clsOf(el); if (cls) rec.cls = cls;
  const own = ownText(el); if (own) rec.own = cut(own, 300);
  const text = textOf(el); if (text) rec.text = cut(text, 300);
  const attrs = {};
  for (const a of el.attributes) {
    if (a.name === 'data-cl-ref' || a.name === 'style' || a.name === 'class' || a.name === 'id') continue;
    if (a.name.startsWith('data-wob')) continue;
    attrs[a.name] = cut(a.value, 100);
  }
  if (Object.keys(attrs).length) rec.attrs = attrs;
  if (tag === 'input' || tag === 'textarea' || tag === 'select') {
    rec.type = tag === 'input' ? (el.type || 'text').toLowerCase() : tag;
    if (tag === 'select') {
      const o = el.options[el.selectedIndex];
      rec.value = o ? collapse(o.text) : '';
    } else if (rec.type !== 'checkbox' && rec.type !== 'radio') rec.value = el.value;
    rec.label = labelOf(el);
  }
  if (role === 'checkbox' || role === 'radio') rec.checked = !!el.checked;
  if (tag === 'option') { rec.selected = !!el.selected; rec.value = el.value; }
  if (el.disabled) rec.disabled = true;
  if (document.activeElement === el && el !== document.body) rec.focused = true;
  let show = false;
  if (tag === 'option') {
    const sel = el.closest('select');
    show = !!sel && isVisible(sel);
  } else if (vis) {
    if (tag === 'label' && el.querySelector('input,select,textarea')) show = false;
    else if (interactive(el, tag, role)) show = true;
    else if (el instanceof SVGElement) show = SHAPES.has(tag);
    else show = !!own;
  }
  rec.show = show;
  return rec;
}
function walk(el, depth, parents, out) {
  if (SKIP_TAGS.has(el.tagName.toUpperCase()) || SKIP_IDS.has(el.id)) return;
  let ref = el.getAttribute('data-cl-ref');
  if (!ref) { ref = String(next++); el.setAttribute('data-cl-ref', ref); }
  const rec = record(el, +ref, depth, parents);
  if (el !== document.body) out.push(rec);
  const down = parents.concat([+ref]);
  const d = rec.show ? depth + 1 : depth;
  for (const c of el.children) walk(c, d, down, out);
}
function status() {
  let reason = typeof WOB_REWARD_REASON === 'undefined' ? null : WOB_REWARD_REASON;
  if (reason !== null && typeof reason !== 'string') {
    try { reason = JSON.stringify(reason); } catch (e) { reason = String(reason); }
  }
  return {done: !!WOB_DONE_GLOBAL, raw_reward: Number(WOB_RAW_REWARD_GLOBAL), reward: Number(WOB_REWARD_GLOBAL),
          reason: reason, episode: WOB_EPISODE_ID};
}
function utterance() {
  const u = core.getUtterance();
  return collapse(typeof u === 'string' ? u : (u && u.utterance) || '');
}
function byRef(ref) {
  const el = document.querySelector('[data-cl-ref="' + String(ref).replace(/"/g, '') + '"]');
  if (!el) throw new Error('no element [' + ref + '] on the page (use a ref from the latest observation)');
  return el;
}
function describe(el) {
  const ref = el.getAttribute && el.getAttribute('data-cl-ref');
  const tag = el.tagName.toLowerCase(), role = roleOf(el, tag);
  const field = tag === 'input' || tag === 'textarea' || tag === 'select';
  const t = cut(field ? labelOf(el) : textOf(el), 30);
  const kind = role === 'input' ? 'input ' + (el.type || 'text') : role;
  return (ref ? '[' + ref + '] ' : '') + kind + (t ? ' ' + JSON.stringify(t) : '');
}
function hits(el, x, y) {
  const h = document.elementFromPoint(x, y);
  return h && (h === el || el.contains(h) || (el.tagName === 'LABEL' && el.control === h)) ? true : h;
}
function needVisible(el, ref) {
  if (!isVisible(el)) throw new Error('element [' + ref + '] is not visible now (hidden, collapsed or closed)');
}
function pad(n) { return String(n).padStart(2, '0'); }
function normDate(s) {
  s = collapse(s);
  let m = s.match(/^(\d{4})-(\d{1,2})-(\d{1,2})$/);
  if (m) return m[1] + '-' + pad(m[2]) + '-' + pad(m[3]);
  m = s.match(/^(\d{1,2})[\/.-](\d{1,2})[\/.-](\d{4})$/);
  if (m) return m[3] + '-' + pad(m[1]) + '-' + pad(m[2]);
  return null;
}
function normTime(s) {
  s = collapse(s).toUpperCase();
  const m = s.match(/^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(AM|PM)?$/);
  if (!m) return null;
  let h = +m[1];
  if (m[4] === 'PM' && h < 12) h += 12;
  if (m[4] === 'AM' && h === 12) h = 0;
  if (h > 23 || +m[2] > 59) return null;
  return pad(h) + ':' + m[2] + (m[3] ? ':' + m[3] : '');
}
function fire(el) {
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
}
window.__cl = {
  start: function (seed, mode) {
    core.EPISODE_MAX_TIME = %(episode_ms)d;
    Math.seedrandom(seed);
    core.setDataMode(mode);
    core.startEpisodeReal();
    return true;
  },
  ready: function () { return typeof WOB_TASK_READY === 'undefined' || !!WOB_TASK_READY; },
  busy: function () {
    return pending.size > 0 || !!(window.jQuery && jQuery.timers && jQuery.timers.length);
  },
  settle: function (maxMs) {
    const t0 = Date.now(), self = this;
    return new Promise((resolve) => {
      let quiet = 0;
      const tick = () => {
        if (self.busy()) quiet = 0; else quiet++;
        if (quiet >= 2 || Date.now() - t0 > maxMs) resolve(status()); else _st.call(window, tick, 10);
      };
      if (window.requestAnimationFrame) {
        let done = false;
        const go = () => { if (!done) { done = true; tick(); } };
        requestAnimationFrame(go); _st.call(window, go, 50);
      } else tick();
    });
  },
  status: status,
  collect: function (all) {
    const out = [];
    walk(document.body, 0, [], out);
    return {utterance: utterance(), status: status(),
            scroll: [Math.round(window.scrollX), Math.round(window.scrollY)],
            elements: all ? out : out.filter((r) => r.show)};
  },
  extra: function (expr) { return (0, eval)(expr); },
  target: function (ref) {
    const el = byRef(ref);
    if (el.tagName === 'OPTION') return {option: true};
    needVisible(el, ref);
    const r0 = el.getBoundingClientRect();
    if (r0.top < 0 || r0.left < 0 || r0.bottom > innerHeight || r0.right > innerWidth)
      el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    const rects = Array.from(el.getClientRects()).filter((r) => r.width > 0 && r.height > 0);
    let blocker = null;
    for (const r of rects) {
      const pts = [[0.5, 0.5], [0.3, 0.3], [0.7, 0.3], [0.3, 0.7], [0.7, 0.7], [0.1, 0.5], [0.9, 0.5],
                   [0.5, 0.1], [0.5, 0.9], [0.1, 0.1], [0.9, 0.1], [0.1, 0.9], [0.9, 0.9]];
      for (const [fx, fy] of pts) {
        const x = r.left + r.width * fx, y = r.top + r.height * fy;
        if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
        const h = hits(el, x, y);
        if (h === true) return {x: x, y: y, what: describe(el)};
        if (!blocker && h) blocker = h;
      }
    }
    const r = rects[0] || el.getBoundingClientRect();
    return {x: r.left + r.width / 2, y: r.top + r.height / 2, what: describe(el),
            covered: blocker ? describe(blocker) : 'outside the window'};
  },
  focusField: function (ref, text) {
    const el = byRef(ref);
    needVisible(el, ref);
    const tag = el.tagName;
    const editable = el.isContentEditable;
    if (!(tag === 'INPUT' || tag === 'TEXTAREA' || editable))
      throw new Error('element [' + ref + '] (' + describe(el) + ') is not a text field');
    if (tag === 'INPUT' && ['checkbox', 'radio', 'button', 'submit', 'reset', 'image', 'file'].includes(el.type))
      throw new Error('element [' + ref + '] is a ' + el.type + ', not a text field (click it instead)');
    if (el.disabled || el.readOnly) throw new Error('element [' + ref + '] is disabled or read-only');
    el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    el.focus();
    if (tag === 'INPUT' && SPECIAL_INPUTS.has(el.type)) {
      let v = String(text);
      if (el.type === 'date' && !(v = normDate(v)))
        throw new Error('a date input takes MM/DD/YYYY or YYYY-MM-DD, not ' + JSON.stringify(text));
      if (el.type === 'time' && !(v = normTime(v)))
        throw new Error('a time input takes HH:MM (24 h) or H:MM AM/PM, not ' + JSON.stringify(text));
      el.value = v;
      if (el.value !== v)
        throw new Error(JSON.stringify(text) + ' is not a valid value for this ' + el.type + ' input');
      fire(el);
      return {set: true, what: describe(el)};
    }
    if (editable) { document.execCommand('selectAll', false, null); document.execCommand('delete', false, null); }
    else if (el.value !== '') { el.value = ''; el.dispatchEvent(new Event('input', {bubbles: true})); }
    return {set: false, what: describe(el)};
  },
  select: function (ref, option) {
    let el = byRef(ref);
    if (el.tagName === 'OPTION') { option = option || el.text; el = el.closest('select'); }
    if (!el || el.tagName !== 'SELECT') throw new Error('element [' + ref + '] is not a dropdown (select)');
    needVisible(el, ref);
    if (el.disabled) throw new Error('element [' + ref + '] is disabled');
    const want = collapse(option), opts = Array.from(el.options);
    let o = opts.find((x) => collapse(x.text) === want) ||
            opts.find((x) => collapse(x.text).toLowerCase() === want.toLowerCase()) ||
            opts.find((x) => x.value === option);
    if (!o) throw new Error('dropdown [' + ref + '] has no option ' + JSON.stringify(option) + '; options: ' +
                            opts.map((x) => JSON.stringify(collapse(x.text))).join(', '));
    el.focus();
    el.selectedIndex = o.index;
    fire(el);
    return {what: describe(el), option: collapse(o.text)};
  },
  point: function (ref) {
    const el = byRef(ref);
    needVisible(el, ref);
    const r = el.getBoundingClientRect();
    return {x: Math.min(Math.max(r.left + r.width / 2, 0), innerWidth - 1),
            y: Math.min(Math.max(r.top + r.height / 2, 0), innerHeight - 1)};
  },
};
return true;
})()
