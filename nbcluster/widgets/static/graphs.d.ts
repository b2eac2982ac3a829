// Types for graphs.js (the drawing module shared with the sidebar panel).
// The snapshot format is documented in nbcluster/metrics/__init__.py. WorkerInfo, TaskRecord,
// ResourceSample, GroupProgress, RunProgress, Band, Summary and Snapshot are the TypedDicts
// of nbcluster/_wire.py (SnapshotWorker for WorkerInfo): tests/test_wire.py fails when a field
// here and there differs in name, optionality or type.

export interface WorkerInfo {
  name: string;
  nthreads: number;
  memory_limit: number;
  resources: Record<string, number>;
  processing: number;
  /** `simulated` only where nbcluster's supervisor assigned the device. */
  gpu?: { name: string | null; memory_total: number | null; simulated?: boolean };
}

export interface TaskRecord {
  key: string;
  prefix: string;
  group: string;
  worker: string;
  start: number;
  stop: number;
  status: 'ok' | 'error';
}

export interface ResourceSample {
  worker: string;
  time: number;
  cpu: number;
  memory: number;
  memory_limit: number;
  net_read: number;
  net_write: number;
  gpu_util?: number;
  gpu_memory?: number;
  gpu_memory_total?: number | null;
}

export interface GroupProgress {
  group: string;
  prefix: string;
  total: number;
  done: number;
  running: number;
  failed: number;
  waiting: number;
}

/** A `%%distribute` run's item counts, as its kernel reports them to the plugin. */
export interface RunProgress {
  run: string;
  time: number;
  /** The counts the kernel reported, each where it did. */
  label?: string | null;
  done?: number;
  failed?: number;
  total?: number;
  cancelled?: number;
  state?: string;
  elapsed?: number;
}

export interface Band {
  time: number;
  workers: number;
  cpu: [number, number, number] | null;
  memory: [number, number, number] | null;
  memory_limit: number;
  gpu_util?: [number, number, number];
}

export interface Summary {
  workers: number;
  threads: number;
  processing: number;
  memory: number;
  memory_limit: number;
  hosts: { host: string; workers: number; threads: number; processing: number; memory: number; memory_limit: number }[];
  more_hosts: number;
}

export interface Snapshot {
  version: number;
  cursor: number;
  gap: boolean;
  now: number;
  /** The scheduler's own view (no nbcluster plugin there): workers and samples, no tasks. */
  basic?: boolean;
  workers: Record<string, WorkerInfo>;
  tasks: TaskRecord[];
  resources: ResourceSample[];
  groups?: GroupProgress[];
  runs?: RunProgress[];
  bands?: Band[];
  summary?: Summary;
}

export interface View {
  cursor: number | null;
  now: number;
  basic: boolean;
  workers: Record<string, WorkerInfo>;
  tasks: TaskRecord[];
  samples: Record<string, ResourceSample[]>;
  bands: Band[];
  summary: Summary | null;
  limits: { maxTasks: number; maxSamples: number };
}

export interface Counts {
  done: number;
  running: number;
  failed: number;
  total: number;
  cancelled?: number;
  pending?: number;
  rate?: number;
  eta?: number | null;
  elapsed?: number;
  state?: 'running' | 'done' | 'failed' | 'cancelled';
  label?: string;
}

export interface Grid {
  params: string[];
  rows: { params: Record<string, unknown>; value?: string; status?: string }[];
  total?: number;
}

/** theme.json: how the graphs look, shared with the frozen picture drawn in Python. */
export const THEME: {
  vars: Record<string, string>;
  styles: Record<string, Record<string, string>>;
  text: Record<string, string>;
  [section: string]: unknown;
};
export function createView(limits: View['limits']): View;
export function applySnapshot(view: View, snapshot: Partial<Snapshot>): View;
export function renderTaskStream(
  container: HTMLElement,
  view: View,
  opts?: { window?: number | null; end?: string }
): HTMLElement;
export function renderResources(
  container: HTMLElement,
  view: View,
  opts?: { window?: number | null }
): HTMLElement;
export function renderProgress(container: HTMLElement, counts: Counts): HTMLElement;
export function renderGrid(container: HTMLElement, grid: Grid): HTMLElement;
export interface Curves {
  metric?: string;
  mode?: "min" | "max" | null;
  series?: { label: string; points: [number, number][]; state: string; best: boolean }[];
}
export function renderCurves(container: HTMLElement, curves: Curves): HTMLElement | null;
export function prefixColor(prefix: string): string;
export function hostOf(address: string): string;
export function formatBytes(n: number): string;
export function formatDuration(seconds: number): string;
export function progressLine(counts: Counts): string;
export function themeStyle(names: string): Record<string, string>;
