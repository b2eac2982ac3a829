import { PageConfig } from '@jupyterlab/coreutils';

import { View } from './graphs';

/**
 * The sidebar's settings, from Dask config on the server (`nbcluster.sidebar.*`,
 * `nbcluster.widget.max-*`): the server extension puts them in the page config as
 * `nbclusterSidebar` (see nbcluster/config.py `sidebar_settings`). Nothing here has a
 * default of its own.
 */
export interface ISidebarSettings {
  /** The view's bounds, as for the notebook widget. */
  limits: View['limits'];
  /** Seconds of task stream and worker charts shown. */
  window: number;
  /** First retry after the live stream drops, then Poll's backoff up to the max. */
  reconnectMs: number;
  reconnectMaxMs: number;
}

export const SETTINGS_KEY = 'nbclusterSidebar';

/** The settings the server sent, or an error naming the fix when it sent none. */
export function sidebarSettings(): ISidebarSettings {
  const raw = PageConfig.getOption(SETTINGS_KEY);
  if (!raw) {
    throw new Error(
      'nbcluster: the server extension is not enabled (jupyter server extension enable nbcluster.server)'
    );
  }
  return JSON.parse(raw) as ISidebarSettings;
}
