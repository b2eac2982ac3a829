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
  return i;
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
    const scale = el('div', 'nbc-card-row');
    scale.append(
      this.scaleInput,
      button('scale', 'Scale', 'Have exactly this many CPU workers'),
      this.minInput,
      el('span', 'nbc-dash', '–'),
      this.maxInput,
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
    this.node.append(head, this.stats, this.meta, scale, actions, this.error);
  }

  update(cluster: ICluster, dashboardURL: string): void {
    const workers = cluster.workers ?? [];
    const running = cluster.state === 'running';
    this.node.dataset.state = cluster.state;
    this.node.dataset.workers = String(workers.length);
    this.badge.textContent = running ? 'running' : 'not answering';
    this.badge.dataset.state = cluster.state;
    this.runsOnLabel.textContent = cluster.runs_on;

    const cores = workers.reduce((n, w) => n + w.nthreads, 0);
    const memory = workers.reduce((n, w) => n + (w.memory_limit || 0), 0);
    const gpus = workers.filter(w => w.gpu).length;
    // Simulated GPUs (NBCLUSTER_SIMULATE_GPUS) must never pass for real ones.
    const simulated = workers.some(w => w.gpu?.simulated);
    const requested = cluster.requested ? cluster.requested.cpu + cluster.requested.gpu : null;
    const parts = running
      ? [
          `${workers.length} worker${workers.length === 1 ? '' : 's'}` +
            (requested !== null && requested !== workers.length ? ` (${requested} requested)` : ''),
          `${cores} cores`,
          formatBytes(memory),
          `${gpus}${simulated ? ' simulated' : ''} GPU${gpus === 1 ? '' : 's'}`,
          `${cluster.tasks?.processing ?? 0} running tasks`
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
    // Prefill the inputs once, so they start from the cluster's state, then leave them
    // to the user.
    if (!this.prefilled && running) {
      this.prefilled = true;
      this.scaleInput.value = String(cluster.requested?.cpu ?? workers.length);
      this.minInput.value = String(cluster.adaptive?.minimum ?? 1);
      this.maxInput.value = String(cluster.adaptive?.maximum ?? Math.max(workers.length, 4));
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
  private prefilled = false;
  private busy = false;
}
