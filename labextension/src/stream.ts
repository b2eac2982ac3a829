import { websocketURL } from './handler';
import { StreamMessage } from './tokens';

/**
 * The api/stream websocket, reopened with backoff when it drops (server restart, proxy
 * timeout). The server pushes; `watch` tells it which cluster's metrics to send.
 */
export class LiveStream {
  constructor(
    private readonly onMessage: (message: StreamMessage) => void,
    private readonly onStatus: (connected: boolean) => void
  ) {}

  /** Start (or keep) the connection. */
  open(): void {
    this.closed = false;
    if (this.socket === null) {
      this.connect();
    }
  }

  /** Stop for good until `open` is called again. */
  close(): void {
    this.closed = true;
    window.clearTimeout(this.retryTimer);
    if (this.socket !== null) {
      this.socket.close();
      this.socket = null;
      this.onStatus(false);
    }
  }

  watch(name: string | null): void {
    this.watched = name;
    this.send();
  }

  private connect(): void {
    const socket = new WebSocket(websocketURL('api/stream'));
    this.socket = socket;
    socket.onopen = () => {
      this.delay = 500;
      this.onStatus(true);
      this.send();
    };
    socket.onmessage = event => {
      this.onMessage(JSON.parse(event.data) as StreamMessage);
    };
    socket.onclose = () => {
      if (this.socket !== socket) {
        return;
      }
      this.socket = null;
      this.onStatus(false);
      if (!this.closed) {
        this.retryTimer = window.setTimeout(() => this.connect(), this.delay);
        this.delay = Math.min(this.delay * 2, 10000);
      }
    };
  }

  private send(): void {
    if (this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ watch: this.watched }));
    }
  }

  private socket: WebSocket | null = null;
  private watched: string | null = null;
  private closed = true;
  private delay = 500;
  private retryTimer = 0;
}
