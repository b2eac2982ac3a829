// Ids, constants and the shapes of the server's JSON. No side effects: safe to import
// anywhere. The routes are documented in nbcluster/server/handlers.py; the metrics
// snapshot in nbcluster/metrics/__init__.py (typed in graphs.d.ts, shared with the widget).
// IGpu, IWorker, ICluster, ITotals and IClusterSpec are the TypedDicts of nbcluster/_wire.py
// (GpuDevice, WorkerRow, Cluster, Totals, SpecFields): tests/test_wire.py fails when a field
// here and there differs in name, optionality or type.

export const PLUGIN_ID = 'nbcluster:plugin';
export const PANEL_ID = 'nbcluster-sidebar';
/** Path of the server extension's routes, below Jupyter's base URL. */
export const API_ROOT = 'nbcluster';

export namespace CommandIDs {
  export const open = 'nbcluster:open';
  export const useInNotebook = 'nbcluster:use-in-notebook';
}

/** A worker memory size such as 4GiB, 512MiB or 2GB (Dask's parse_bytes accepts more). */
export const MEMORY_PATTERN = /^\s*\d+(\.\d+)?\s*(b|k|m|g|t|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$/i;

/** A GPU the supervisor assigned to a worker; `simulated`: made up for a course or a test. */
export interface IGpu {
  index: number;
  name: string;
  memory_total: number | null;
  uuid: string | null;
  simulated: boolean;
}

export interface IWorker {
  name: string;
  address: string;
  kind: 'cpu' | 'gpu';
  nthreads: number;
  memory_limit: number | null;
  memory: number;
  cpu: number;
  resources: Record<string, number>;
  processing: number;
  gpu: IGpu | null;
  /** Where it runs, and its batch job where there is one (dask-jobqueue backends). */
  host: string | null;
  job_id: string | null;
}

/** What a cluster was started with (`ClusterSpec`). */
export interface IClusterSpec {
  workers: number | null;
  threads: number | null;
  memory: number | null;
  gpus: number | string | null;
  name: string | null;
  keep: boolean;
  dashboard: boolean;
  backend: string;
  gpu_backend: string;
  gpus_per_worker: number;
  gpu_threads: number;
  profile: string;
}

/** One entry of GET api/clusters: the scheduler's answer, or the registry entry alone. */
export interface ICluster {
  name: string;
  address: string;
  state: 'running' | 'unreachable';
  dashboard: string | null;
  owner_pid: number | null;
  /** True when this Jupyter server owns it (it stops when the server stops). */
  server_owned: boolean;
  created: number | null;
  /** Where it runs, in the words of `%cluster list`: `local`, `hpc (slurm)`, `external`. */
  runs_on: string;
  spec?: IClusterSpec | null;
  backend?: string | null;
  profile?: string | null;
  supervisor_pid?: number;
  /** A scheduler nbcluster did not start: scale, adapt, restart and stop are refused. */
  external?: boolean;
  /** One line the backend has for the user, said at start (nbcluster/_wire.py). */
  notice?: string;
  /** Absent from the live stream (which sends `totals` instead) and when unreachable. */
  workers?: IWorker[];
  requested?: { cpu: number; gpu: number };
  adaptive?: { minimum: number; maximum: number; gpu_maximum?: number } | null;
  tasks?: { processing?: number; waiting?: number; memory?: number; erred?: number };
  /** Dask clients connected to its scheduler (notebook kernels using it). */
  clients?: number | null;
  /** RAM of each host the supervisor can see (absent from the live stream). */
  host_memory?: Record<string, number>;
  /** Totals over every worker, as `%cluster status` prints them (nbcluster/cluster/info.py). */
  totals?: ITotals;
}

/** `cluster_totals` in nbcluster/cluster/info.py; memory is capped at each host's RAM. */
export interface ITotals {
  workers: number;
  cores: number;
  memory: number;
  memory_limit: number;
  gpus: number;
  simulated_gpus: number;
}

/** A backend profile from Dask config (`nbcluster.profiles.NAME`). */
export interface IProfile {
  name: string;
  backend: string;
  description: string;
}

/** GET api/profiles: the backends, and the cluster-name rule (nbcluster/cluster/spec.py). */
export interface IProfilesReply {
  profiles: IProfile[];
  /** A regular expression, unanchored, that Python and JavaScript read alike. */
  name_pattern: string;
  /** The rule in words, as the server's own message gives it. */
  name_rule: string;
}

/** Body of POST api/clusters; a missing field means the cluster layer's default. */
export interface IStartRequest {
  workers?: number;
  threads?: number;
  memory?: string;
  gpu_workers?: number | 'auto';
  name?: string;
  keep?: boolean;
  dashboard?: boolean;
  profile?: string;
  force?: boolean;
}

/** Messages on the api/stream websocket (server -> browser). */
export type StreamMessage =
  | { type: 'clusters'; clusters: ICluster[] }
  | { type: 'metrics'; name: string; snapshot: import('./graphs').Snapshot }
  | { type: 'gone'; name: string };
