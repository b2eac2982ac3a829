import { Poll } from '@lumino/polling';

import { websocketURL } from './handler';
import { ISidebarSettings } from './settings';
import { StreamMessage } from './tokens';

/**
 * The api/stream websocket, kept open by a `Poll` from @lumino/polling: each tick opens
 * the socket and lasts as long as it does. A connection that ends after it was open is
 * reopened after `reconnectMs`; one that cannot open is retried with Poll's backoff, up to
 * `reconnectMaxMs` apart. While the browser tab is hidden no reconnection is tried, and
 * `close` (the panel hidden or detached) stops the poll until `open`. The intervals come
 * from the server (Dask config `nbcluster.sidebar.*`). The server pushes; `watch` tells it
 * which cluster's metrics to send.
 */
export class LiveStream {
  constructor(
    private readonly onMessage: (message: StreamMessage) => void,
    private readonly onStatus: (connected: boolean) => void,
    settings: ISidebarSettings
  ) {
    this.poll = new Poll({
      auto: false,
      factory: () => this.session(),
      frequency: { interval: settings.reconnectMs, backoff: true, max: settings.reconnectMaxMs },
      name: 'nbcluster:stream',
      standby: 'when-hidden'
    });
  }

  /** Start (or keep) the connection. */
  open(): void {
    void this.poll.start();
  }

  /** Stop for good until `open` is called again. */
  close(): void {
    void this.poll.stop();
    this.drop();
  }

  dispose(): void {
    this.poll.dispose();
    this.drop();
  }

  watch(name: string | null): void {
    this.watched = name;
    this.send();
  }

  /** One connection: resolves when an open socket closes, rejects if it never opened. */
  private session(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const socket = new WebSocket(websocketURL('api/stream'));
      let opened = false;
      this.socket = socket;
      socket.onopen = () => {
        opened = true;
        this.onStatus(true);
        this.send();
      };
      socket.onmessage = event => {
        this.onMessage(JSON.parse(event.data) as StreamMessage);
      };
      socket.onclose = () => {
        if (this.socket === socket) {
          this.socket = null;
          if (opened) {
            this.onStatus(false);
          }
        }
        if (opened) {
          resolve();
        } else {
          reject(new Error('nbcluster: the live stream did not open'));
        }
      };
    });
  }

  private drop(): void {
    const socket = this.socket;
    if (socket !== null) {
      this.socket = null;
      socket.close();
      this.onStatus(false);
    }
  }

  private send(): void {
    if (this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ watch: this.watched }));
    }
  }

  private readonly poll: Poll;
  private socket: WebSocket | null = null;
  private watched: string | null = null;
}
