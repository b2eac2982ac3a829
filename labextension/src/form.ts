import { IProfilesReply, IStartRequest, MEMORY_PATTERN } from './tokens';

/** A labelled input row; `name` doubles as the form field's name for tests and CSS. */
function field(label: string, input: HTMLInputElement | HTMLSelectElement, hint = ''): HTMLElement {
  const row = document.createElement('label');
  row.className = 'nbc-field';
  const text = document.createElement('span');
  text.textContent = label;
  row.append(text, input);
  if (hint) {
    row.title = hint;
  }
  return row;
}

function input(name: string, type: string, placeholder: string): HTMLInputElement {
  const el = document.createElement('input');
  el.name = name;
  el.type = type;
  el.placeholder = placeholder;
  el.className = 'jp-mod-styled';
  return el;
}

/** A whole number >= minimum from a text field; '' means "use the default". */
function count(value: string, what: string, minimum: number): number | undefined {
  const text = value.trim();
  if (text === '') {
    return undefined;
  }
  if (!/^\d+$/.test(text) || Number(text) < minimum) {
    throw new Error(`${what} must be a whole number of at least ${minimum}`);
  }
  return Number(text);
}

/**
 * The "New cluster" form. It checks what it can before asking the server, so most
 * mistakes are caught without a round trip; the server checks everything again and its
 * message is shown in the same place.
 */
export class NewClusterForm {
  readonly node: HTMLFormElement;

  constructor() {
    const form = document.createElement('form');
    form.className = 'nbc-form';
    form.noValidate = true; // our messages, not the browser's bubbles
    // Text, not type=number: a number input reports '' for what it cannot parse, which
    // would silently mean "default" instead of an error message.
    this.workers = input('workers', 'text', 'auto');
    this.workers.inputMode = 'numeric';
    this.workers.value = '2';
    this.threads = input('threads', 'text', '1');
    this.threads.inputMode = 'numeric';
    this.memory = input('memory', 'text', 'auto, e.g. 2GiB');
    this.gpus = input('gpus', 'text', 'none, auto or a number');
    this.name = input('name', 'text', 'auto');
    this.keep = input('keep', 'checkbox', '');
    this.dashboard = input('dashboard', 'checkbox', '');
    this.force = input('force', 'checkbox', '');
    this.profile = document.createElement('select');
    this.profile.name = 'profile';
    this.profile.className = 'jp-mod-styled';
    this.error = document.createElement('div');
    this.error.className = 'nbc-form-error';
    this.error.setAttribute('role', 'alert');
    this.submit = document.createElement('button');
    this.submit.type = 'submit';
    this.submit.className = 'jp-mod-styled jp-mod-accept';
    this.submit.textContent = 'Start cluster';
    const cancel = document.createElement('button');
    cancel.type = 'button';
    cancel.className = 'jp-mod-styled';
    cancel.dataset.action = 'cancel-form';
    cancel.textContent = 'Cancel';
    const buttons = document.createElement('div');
    buttons.className = 'nbc-form-buttons';
    buttons.append(this.submit, cancel);
    form.append(
      field('Workers', this.workers, 'CPU worker processes; empty: one per core'),
      field('Threads per worker', this.threads),
      field('Memory per worker', this.memory, 'e.g. 2GiB; empty: a share of this machine'),
      field('GPU workers', this.gpus, '"auto": one per GPU, or a number; empty: none'),
      field('Name', this.name, 'empty: picked for you'),
      field('Keep alive', this.keep, 'keep running when this server stops'),
      field('Dask dashboard', this.dashboard, 'serve the Bokeh dashboard (proxied by Jupyter)'),
      field('Backend', this.profile),
      // The server's size messages say "add --force": this is that switch.
      field('Force (--force)', this.force, "allow sizes past this machine's own limits (never past a limit set in config)"),
      this.error,
      buttons
    );
    this.node = form;
  }

  /** The server's backends, and its name rule for the instant hint. */
  setProfiles(reply: IProfilesReply): void {
    this.nameRule = { pattern: new RegExp(`^(?:${reply.name_pattern})$`), words: reply.name_rule };
    this.name.title = reply.name_rule;
    this.profile.replaceChildren(
      ...reply.profiles.map(p => {
        const option = document.createElement('option');
        option.value = p.name;
        // The description says where it runs ("Campus cluster, debug partition").
        option.textContent = p.description ? `${p.name}: ${p.description}` : p.name;
        option.title = `${p.backend} backend`;
        return option;
      })
    );
  }

  /** The request body, or an Error naming the first bad field (also shown in the form). */
  read(): IStartRequest {
    const body: IStartRequest = { keep: this.keep.checked, dashboard: this.dashboard.checked };
    if (this.force.checked) {
      body.force = true;
    }
    try {
      body.workers = count(this.workers.value, 'Workers', 0);
      body.threads = count(this.threads.value, 'Threads per worker', 1);
      const memory = this.memory.value.trim();
      if (memory !== '' && memory !== 'auto') {
        if (!MEMORY_PATTERN.test(memory)) {
          throw new Error('Memory per worker must be a size like 2GiB or 512MiB');
        }
        body.memory = memory;
      }
      const gpus = this.gpus.value.trim().toLowerCase();
      if (gpus === 'auto') {
        body.gpu_workers = 'auto';
      } else if (gpus !== '' && gpus !== 'none') {
        body.gpu_workers = count(gpus, 'GPU workers', 0);
      }
      const name = this.name.value.trim();
      if (name !== '') {
        // Until the server's rule is known, the server's answer is the check.
        if (this.nameRule && !this.nameRule.pattern.test(name)) {
          throw new Error(`Name: ${this.nameRule.words}`);
        }
        body.name = name;
      }
      if (this.profile.value) {
        body.profile = this.profile.value;
      }
    } catch (error) {
      this.showError((error as Error).message);
      throw error;
    }
    this.showError('');
    return body;
  }

  showError(message: string): void {
    this.error.textContent = message;
  }

  setBusy(busy: boolean): void {
    this.submit.disabled = busy;
    this.submit.textContent = busy ? 'Starting…' : 'Start cluster';
  }

  private nameRule: { pattern: RegExp; words: string } | null = null;
  private readonly workers: HTMLInputElement;
  private readonly threads: HTMLInputElement;
  private readonly memory: HTMLInputElement;
  private readonly gpus: HTMLInputElement;
  private readonly name: HTMLInputElement;
  private readonly keep: HTMLInputElement;
  private readonly dashboard: HTMLInputElement;
  private readonly force: HTMLInputElement;
  private readonly profile: HTMLSelectElement;
  private readonly error: HTMLElement;
  private readonly submit: HTMLButtonElement;
}
