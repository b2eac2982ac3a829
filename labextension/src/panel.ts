import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ClusterCard } from './card';
import { NewClusterForm } from './form';
import {
  applySnapshot,
  Counts,
  createView,
  renderProgress,
  renderResources,
  renderTaskStream,
  Snapshot,
  View
} from './graphs';
import { dashboardURL, requestAPI } from './handler';
import { ISidebarSettings } from './settings';
import { LiveStream } from './stream';
import { ICluster, IProfilesReply, StreamMessage } from './tokens';

export interface IClusterPanelOptions {
  /** Runs `%cluster use NAME` in the active notebook; rejects with a message to show. */
  useInNotebook: (name: string) => Promise<string>;
  /** From the server's Dask config. */
  settings: ISidebarSettings;
}

function div(className: string, text?: string): HTMLDivElement {
  const node = document.createElement('div');
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** "No clusters running…", with the commands set as code (not in literal backticks). */
function emptyNote(): HTMLDivElement {
  const note = div('nbc-empty');
  const code = (text: string) => {
    const c = document.createElement('code');
    c.textContent = text;
    return c;
  };
  note.append(
    'No clusters running. Start one here, with ',
    code('%cluster start'),
    ' in a notebook, or ',
    code('nbcluster start'),
    '.'
  );
  return note;
}

/**
 * The sidebar: every registered cluster, a form to start one, per-cluster controls, and
 * live graphs of the selected cluster.
 *
 * Nothing is cached beyond what is on screen: the server pushes the full cluster list
 * every `nbcluster.sidebar.interval` (api/stream), so a cluster started in a kernel or the CLI appears,
 * and one that died disappears, without any action here. Actions go through REST and
 * their result arrives with the next push.
 */
export class ClusterPanel extends Widget {
  constructor(private readonly options: IClusterPanelOptions) {
    super();
    this.addClass('nbc-panel');
    this.title.caption = 'Dask clusters (nbcluster)';

    const header = div('nbc-header');
    const title = div('nbc-title', 'Clusters');
    const newButton = document.createElement('button');
    newButton.className = 'jp-mod-styled jp-mod-accept nbc-new';
    newButton.type = 'button';
    newButton.dataset.action = 'new';
    newButton.textContent = 'New cluster';
    header.append(title, this.status, newButton);

    this.form.node.hidden = true;
    this.graphs.hidden = true;
    this.graphs.append(this.graphsTitle, this.progress, this.taskStream, this.resources);
    this.node.append(header, this.form.node, this.empty, this.list, this.graphs);
    this.setConnected(false);
  }

  /** Lumino's EventListener protocol: `this` is the listener, so removal always matches. */
  handleEvent(event: Event): void {
    if (event.type === 'click') {
      this.onClick(event as MouseEvent);
    } else if (event.type === 'submit') {
      event.preventDefault();
      void this.startCluster();
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.node.addEventListener('click', this);
    this.form.node.addEventListener('submit', this);
    if (this.isVisible) {
      this.stream.open();
    }
    void this.loadProfiles();
  }

  protected onBeforeDetach(msg: Message): void {
    this.node.removeEventListener('click', this);
    this.form.node.removeEventListener('submit', this);
    this.stream.close();
    super.onBeforeDetach(msg);
  }

  // A collapsed sidebar is hidden, not detached. The server polls every scheduler for
  // each open stream, so a panel nobody sees closes its stream until shown again.
  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.stream.open();
  }

  protected onBeforeHide(msg: Message): void {
    this.stream.close();
    super.onBeforeHide(msg);
  }

  dispose(): void {
    this.stream.dispose();
    super.dispose();
  }

  private async loadProfiles(): Promise<void> {
    try {
      this.form.setProfiles(await requestAPI<IProfilesReply>('api/profiles'));
    } catch (error) {
      this.form.showError(`Cannot list backends: ${(error as Error).message}`);
    }
  }

  private onClick(event: MouseEvent): void {
    const target = (event.target as HTMLElement).closest<HTMLElement>('[data-action]');
    if (!target || !this.node.contains(target)) {
      return;
    }
    const action = target.dataset.action!;
    if (action === 'new') {
      this.form.node.hidden = !this.form.node.hidden;
      return;
    }
    if (action === 'cancel-form') {
      this.form.node.hidden = true;
      return;
    }
    const name = target.closest<HTMLElement>('.nbc-card')?.dataset.name;
    const card = name ? this.cards.get(name) : undefined;
    if (!card) {
      return;
    }
    if (action === 'select') {
      this.select(card.name);
    } else {
      void this.act(card, action);
    }
  }

  private async startCluster(): Promise<void> {
    let body;
    try {
      body = this.form.read();
    } catch {
      return; // the form shows what is wrong
    }
    this.form.setBusy(true);
    try {
      const cluster = await requestAPI<ICluster>('api/clusters', {
        method: 'POST',
        body: JSON.stringify(body)
      });
      this.form.node.hidden = true;
      this.updateClusters([...this.clusters.filter(c => c.name !== cluster.name), cluster]);
      this.select(cluster.name);
    } catch (error) {
      this.form.showError((error as Error).message);
    } finally {
      this.form.setBusy(false);
    }
  }

  private async act(card: ClusterCard, action: string): Promise<void> {
    const path = `api/clusters/${encodeURIComponent(card.name)}`;
    card.showError('');
    card.setBusy(true);
    try {
      switch (action) {
        case 'scale':
          await requestAPI(`${path}/scale`, {
            method: 'POST',
            body: JSON.stringify({ workers: this.count(card.value('scale'), 'Workers') })
          });
          break;
        case 'adapt':
          await requestAPI(`${path}/adapt`, {
            method: 'POST',
            body: JSON.stringify({
              minimum: this.count(card.value('adapt-min'), 'Minimum'),
              maximum: this.count(card.value('adapt-max'), 'Maximum')
            })
          });
          break;
        case 'restart': {
          card.setWorking('restart', 'Restarting…');
          const after = await requestAPI<ICluster>(`${path}/restart`, { method: 'POST', body: '{}' });
          const n = after.totals?.workers ?? 0;
          Notification.success(`Restarted ${n} worker${n === 1 ? '' : 's'} of ${card.name}`, {
            autoClose: 4000
          });
          break;
        }
        case 'stop': {
          if (!(await this.confirmStop(card.name))) {
            return;
          }
          card.setWorking('stop', 'Stopping…');
          this.stopping.add(card.name);
          await requestAPI(path, { method: 'DELETE' });
          this.updateClusters(this.clusters.filter(c => c.name !== card.name));
          return;
        }
        case 'use':
          Notification.success(await this.options.useInNotebook(card.name), { autoClose: 4000 });
          break;
      }
      card.release();
      // Show the result now rather than on the next push.
      const cluster = await requestAPI<ICluster>(path);
      this.updateClusters([...this.clusters.filter(c => c.name !== cluster.name), cluster]);
    } catch (error) {
      this.stopping.delete(card.name);
      card.showError((error as Error).message);
    } finally {
      card.setWorking(action, null);
      card.setBusy(false);
    }
  }

  /**
   * Stopping a cluster that is working, or that a notebook uses, loses that work: ask
   * first, saying why. An idle cluster nobody else uses stops at once.
   */
  private async confirmStop(name: string): Promise<boolean> {
    const cluster = this.clusters.find(c => c.name === name);
    const running = cluster?.tasks?.processing ?? 0;
    const clients = cluster?.clients ?? 0;
    const reasons: string[] = [];
    if (running) {
      reasons.push(`${running} task${running === 1 ? ' is' : 's are'} running on it`);
    }
    if (clients) {
      reasons.push(`${clients} notebook kernel${clients === 1 ? ' uses' : 's use'} it`);
    }
    if (!reasons.length) {
      return true;
    }
    const result = await showDialog({
      title: `Stop cluster ${name}?`,
      body: `${reasons.join(' and ')}. Stopping it ends that work and every worker.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop it' })]
    });
    return result.button.accept;
  }

  private count(text: string, what: string): number {
    if (!/^\s*\d+\s*$/.test(text)) {
      throw new Error(`${what} must be a whole number`);
    }
    return Number(text);
  }

  private select(name: string | null): void {
    if (name === this.selected) {
      return;
    }
    this.selected = name;
    this.view = this.newView();
    this.runs = [];
    for (const card of this.cards.values()) {
      card.setSelected(card.name === name);
    }
    this.graphs.hidden = name === null;
    this.graphs.dataset.cluster = name ?? '';
    this.graphsTitle.textContent = name ? `Live: ${name}` : '';
    this.stream.watch(name);
    if (name !== null) {
      this.draw();
    }
  }

  private onMessage(message: StreamMessage): void {
    if (message.type === 'clusters') {
      this.updateClusters(message.clusters);
    } else if (message.type === 'metrics' && message.name === this.selected) {
      this.addSnapshot(message.snapshot);
    } else if (message.type === 'gone' && message.name === this.selected) {
      this.select(null);
    }
  }

  private addSnapshot(snapshot: Snapshot): void {
    if (snapshot.gap) {
      this.view = this.newView(); // the server dropped records we never saw: redraw
    }
    applySnapshot(this.view, snapshot);
    this.runs = snapshot.runs ?? this.runs;
    this.draw();
  }

  private newView(): View {
    return createView(this.options.settings.limits);
  }

  private draw(): void {
    const window = this.options.settings.window;
    renderTaskStream(this.taskStream, this.view, { window });
    renderResources(this.resources, this.view, { window });
    // Items, as the cell counts them: the latest `%%distribute` run's own report (a batch
    // task holds many items, so the scheduler's task counts would not match the cell).
    // Once it has ended it stays shown with its outcome ("done in 3.2 s"), never "0 / 0".
    const run = this.runs.length ? this.runs[this.runs.length - 1] : null;
    if (run) {
      renderProgress(this.progress, { ...run, running: 0, label: run.label ?? undefined } as Counts);
    } else {
      this.progress.replaceChildren(div('nbc-idle', 'No %%distribute run yet on this cluster.'));
    }
  }

  private updateClusters(clusters: ICluster[]): void {
    this.clusters = clusters;
    const names = new Set(clusters.map(c => c.name));
    for (const [name, card] of this.cards) {
      if (!names.has(name)) {
        // Gone: stopped here, elsewhere, or died. Never leave a card spinning.
        card.node.remove();
        this.cards.delete(name);
        if (!this.stopping.delete(name)) {
          Notification.info(`Cluster ${name} is gone`, { autoClose: 4000 });
        }
        if (this.selected === name) {
          this.select(null);
        }
      }
    }
    for (const cluster of clusters) {
      let card = this.cards.get(cluster.name);
      if (!card) {
        card = new ClusterCard(cluster.name);
        this.cards.set(cluster.name, card);
        this.list.append(card.node);
      }
      card.update(cluster, dashboardURL(cluster.name));
    }
    this.empty.hidden = clusters.length > 0;
    if (this.selected === null && clusters.length === 1) {
      this.select(clusters[0].name);
    }
  }

  private setConnected(connected: boolean): void {
    if (connected && this.selected !== null) {
      // A new connection starts a new cursor: the server resends what its rings hold,
      // which would double what the view already has.
      this.view = this.newView();
      this.runs = [];
    }
    this.status.textContent = connected ? '' : 'connecting…';
    this.node.dataset.connected = String(connected);
  }

  private readonly form = new NewClusterForm();
  private readonly status = div('nbc-status');
  private readonly empty = emptyNote();
  private readonly list = div('nbc-list');
  private readonly graphs = div('nbc-graphs');
  private readonly graphsTitle = div('nbc-graphs-title');
  private readonly progress = div('nbc-graph-progress');
  private readonly taskStream = div('nbc-graph-tasks');
  private readonly resources = div('nbc-graph-resources');
  private readonly cards = new Map<string, ClusterCard>();
  /** Clusters stopped from this panel: their disappearance is expected, not news. */
  private readonly stopping = new Set<string>();
  private readonly stream = new LiveStream(
    message => this.onMessage(message),
    connected => this.setConnected(connected),
    this.options.settings
  );
  private clusters: ICluster[] = [];
  private selected: string | null = null;
  private view: View = this.newView();
  private runs: NonNullable<Snapshot['runs']> = [];
}
