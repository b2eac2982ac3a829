import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { API_ROOT } from './tokens';

/**
 * Call the nbcluster server extension and return its JSON (undefined for 204).
 *
 * ServerConnection adds the token or XSRF header and the base URL (JupyterHub's
 * /user/<name>/ prefix included). A failure becomes an Error whose message is the
 * server's one-line `message`, ready to show to the user as is.
 */
export async function requestAPI<T>(endPoint = '', init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_ROOT, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: { message?: string } | undefined = undefined;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!response.ok) {
    const message = data?.message ?? `${response.status} ${response.statusText}`;
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}

/** ws(s):// URL of a server route, with the token when the page has one. */
export function websocketURL(endPoint: string): string {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.wsUrl, API_ROOT, endPoint);
  // Browsers cannot set headers on a websocket. Same-origin pages are authenticated by
  // Jupyter's cookie; only a cross-origin setup needs the token in the URL, exactly when
  // JupyterLab's own kernel websockets add it.
  return settings.appendToken && settings.token
    ? `${url}?token=${encodeURIComponent(settings.token)}`
    : url;
}

/** Browser URL of a cluster's proxied Dask dashboard. */
export function dashboardURL(name: string): string {
  const settings = ServerConnection.makeSettings();
  return URLExt.join(settings.baseUrl, API_ROOT, 'dashboard', encodeURIComponent(name), 'status');
}
