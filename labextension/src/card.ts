import { formatBytes, formatDuration } from './graphs';
import { ICluster } from './tokens';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function button(action: string, label: string, title: string): HTMLButtonElement {
  const b = el('button', 'jp-mod-styled nbc-button', label);
  b.type = 'button';
  b.dataset.action = action;
  b.title = title;
  return b;
}

function numberInput(role: string, label: string): HTMLInputElement {
  const i = el('input', 'jp-mod-styled nbc-number');
  i.type = 'text';
  i.inputMode = 'numeric';
  i.dataset.role = role;
  i.setAttribute('aria-label', label);
  // Typed by the user: the cluster's own numbers no longer overwrite it.
  i.addEventListener('input', () => (i.dataset.edited = 'true'));
  return i;
}

/** A visible label around an input, so each box says what it is. */
function labelled(text: string, input: HTMLInputElement): HTMLLabelElement {
  const label = el('label', 'nbc-inline-label');
  label.append(el('span', '', text), input);
  return label;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** Show `value` in an input unless the user is editing it. */
function follow(input: HTMLInputElement, value: number): void {
  if (document.activeElement !== input && input.dataset.edited !== 'true') {
    input.value = String(value);
  }
}

/**
 * One cluster in the list. Built once and updated in place on every push, so a number
 * being typed into "scale" survives the refreshes. Clicks are handled by the panel
 * (one delegated listener), which reads `data-action` and the card's `data-name`.
 */
export class ClusterCard {
  readonly node: HTMLElement;

  constructor(readonly name: string) {
    this.node = el('div', 'nbc-card');
    this.node.dataset.name = name;
    const head = el('div', 'nbc-card-head');
    head.dataset.action = 'select';
    head.title = 'Show live graphs for this cluster';
    this.runsOnLabel.title = 'Where it runs: the backend profile it was started with';
    head.append(el('span', 'nbc-card-name', name), this.runsOnLabel, this.badge);

    this.scaleInput = numberInput('scale', `Number of workers of ${name}`);
    this.minInput = numberInput('adapt-min', `Adaptive minimum of ${name}`);
    this.maxInput = numberInput('adapt-max', `Adaptive maximum of ${name}`);
    const scale = el('div', 'nbc-card-row nbc-scale-row');
    scale.append(
      labelled('Workers', this.scaleInput),
      button('scale', 'Scale', 'Have exactly this many CPU workers')
    );
    const adapt = el('div', 'nbc-card-row nbc-adapt-row');
    adapt.append(
      labelled('Min', this.minInput),
      labelled('Max', this.maxInput),
      button('adapt', 'Adapt', 'Let the cluster grow and shrink between min and max by load')
    );
    this.dashboard = el('a', 'nbc-link', 'Dashboard');
    this.dashboard.target = '_blank';
    this.dashboard.rel = 'noopener';
    const actions = el('div', 'nbc-card-row');
    actions.append(
      button('use', 'Use in this notebook', "Run `%cluster use` in the current notebook's kernel"),
      button('restart', 'Restart workers', 'Restart every worker process (frees their memory)'),
      button('stop', 'Stop', 'Stop the cluster and all its workers'),
      this.dashboard
    );
    this.error.setAttribute('role', 'alert');
    this.node.append(head, this.stats, this.meta, scale, adapt, actions, this.error);
  }

  update(cluster: ICluster, dashboardURL: string): void {
    const workers = cluster.workers ?? [];
    const running = cluster.state === 'running';
    this.node.dataset.state = cluster.state;
    this.badge.textContent = running ? 'running' : 'not answering';
    this.badge.dataset.state = cluster.state;
    this.runsOnLabel.textContent = cluster.runs_on;

    // The server's totals (nbcluster/cluster/info.py), the same `%cluster status` prints;
    // the stream sends these instead of one row per worker.
    const t = cluster.totals;
    const count = t?.workers ?? workers.length;
    this.node.dataset.workers = String(count);
    const requested = cluster.requested ? cluster.requested.cpu + cluster.requested.gpu : null;
    const parts =
      running && t
        ? [
            plural(count, 'worker') +
              (requested !== null && requested !== count ? ` (${requested} requested)` : ''),
            plural(t.cores, 'core'),
            `${formatBytes(t.memory)} used of ${formatBytes(t.memory_limit)}`,
            // Simulated GPUs (NBCLUSTER_SIMULATE_GPUS) must never pass for real ones.
            t.gpus ? `${t.gpus}${t.simulated_gpus ? ' simulated' : ''} GPU${t.gpus === 1 ? '' : 's'}` : 'no GPUs',
            plural(cluster.tasks?.processing ?? 0, 'running task')
          ]
        : ['its scheduler does not answer'];
    if (cluster.adaptive) {
      parts.push(`adaptive ${cluster.adaptive.minimum}–${cluster.adaptive.maximum}`);
    }
    this.stats.textContent = parts.join(' · ');

    const owner =
      cluster.owner_pid === null
        ? 'kept (no owner)'
        : cluster.server_owned
          ? 'owned by this Jupyter server'
          : `owned by pid ${cluster.owner_pid}`;
    const age = cluster.created ? formatDuration(Math.max(Date.now() / 1000 - cluster.created, 0)) : '?';
    this.meta.textContent = `${owner} · up ${age} · ${cluster.address}`;

    this.dashboard.hidden = !cluster.dashboard;
    this.dashboard.href = cluster.dashboard ? dashboardURL : '';
    for (const b of this.node.querySelectorAll<HTMLButtonElement>('button')) {
      b.disabled = this.busy || (!running && b.dataset.action !== 'stop');
    }
    // The inputs follow the cluster (adapt resizes it behind the user's back) until the
    // user types in one; a scale or adapt from this card hands them back (`release`).
    if (running) {
      follow(this.scaleInput, cluster.requested?.cpu ?? count);
      follow(this.minInput, cluster.adaptive?.minimum ?? 1);
      follow(this.maxInput, cluster.adaptive?.maximum ?? Math.max(count, 4));
    }
  }

  setSelected(selected: boolean): void {
    this.node.classList.toggle('nbc-selected', selected);
  }

  setBusy(busy: boolean): void {
    this.busy = busy;
    this.node.classList.toggle('nbc-busy', busy);
    for (const b of this.node.querySelectorAll<HTMLButtonElement>('button')) {
      b.disabled = busy;
    }
  }

  /** After an action: the inputs follow the cluster again. */
  release(): void {
    for (const input of [this.scaleInput, this.minInput, this.maxInput]) {
      delete input.dataset.edited;
    }
  }

  /** Say what the card is doing on the button that started it ("Restarting…"). */
  setWorking(action: string, text: string | null): void {
    const b = this.node.querySelector<HTMLButtonElement>(`button[data-action="${action}"]`);
    if (b) {
      b.dataset.label = b.dataset.label ?? b.textContent ?? '';
      b.textContent = text ?? b.dataset.label;
    }
  }

  showError(message: string): void {
    this.error.textContent = message;
  }

  /** The value of one of the card's number inputs, as typed. */
  value(role: 'scale' | 'adapt-min' | 'adapt-max'): string {
    return { scale: this.scaleInput, 'adapt-min': this.minInput, 'adapt-max': this.maxInput }[role].value;
  }

  private readonly badge = el('span', 'nbc-badge');
  private readonly runsOnLabel = el('span', 'nbc-card-runs-on');
  private readonly stats = el('div', 'nbc-card-stats');
  private readonly meta = el('div', 'nbc-card-meta');
  private readonly error = el('div', 'nbc-card-error');
  private readonly dashboard: HTMLAnchorElement;
  private readonly scaleInput: HTMLInputElement;
  private readonly minInput: HTMLInputElement;
  private readonly maxInput: HTMLInputElement;
  private busy = false;
}
