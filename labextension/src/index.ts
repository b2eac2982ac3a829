import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { KernelMessage } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';

import { ClusterPanel } from './panel';
import { ISidebarSettings, sidebarSettings } from './settings';
import { CommandIDs, PANEL_ID, PLUGIN_ID } from './tokens';

const clusterIcon = new LabIcon({
  name: 'nbcluster:cluster',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<circle cx="12" cy="5" r="3"/><circle cx="5" cy="18" r="3"/><circle cx="19" cy="18" r="3"/>' +
    '<path d="M11 7.5h2v3l4.6 4.2-1.3 1.5L12 12.3l-4.3 3.9-1.3-1.5L11 10.5z"/></g></svg>'
});

/**
 * The code "use in this notebook" runs in the kernel: load the IPython extension if the
 * notebook has not, then make the cluster current. Plain Python calls rather than
 * `%load_ext`, which prints a warning when the extension is already loaded.
 */
export function useCode(name: string): string {
  // The name enters Python source only as a string literal (a JSON string is a valid
  // Python one), so no name can inject code; `%cluster use` checks it against the rule.
  return [
    'get_ipython().extension_manager.load_extension("nbcluster")',
    `get_ipython().run_line_magic("cluster", ${JSON.stringify(`use ${name}`)})`
  ].join('\n');
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Sidebar to list, start, scale and watch nbcluster Dask clusters.',
  autoStart: true,
  optional: [INotebookTracker, ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const useInNotebook = async (name: string): Promise<string> => {
      // The main area's notebook; the tracker's "current" alone can be unset in
      // Notebook 7 until the notebook has had focus once.
      const shown = app.shell.currentWidget;
      const notebook =
        shown && notebooks?.has(shown) ? (shown as NotebookPanel) : notebooks?.currentWidget;
      if (!notebook) {
        throw new Error('Open a notebook first');
      }
      // A notebook just opened may still be starting its kernel: wait for that rather
      // than fail.
      await notebook.sessionContext.ready;
      const kernel = notebook.sessionContext.session?.kernel;
      if (!kernel) {
        throw new Error(`${notebook.title.label} has no running kernel: start one first`);
      }
      // Queued behind a running cell like any execution; the panel stays usable meanwhile.
      const reply = await kernel.requestExecute({
        code: useCode(name),
        silent: false,
        store_history: false
      }).done;
      const content = reply.content as KernelMessage.IExecuteReplyMsg['content'];
      if (content.status === 'error') {
        throw new Error(`${content.ename}: ${content.evalue}`);
      }
      return `${notebook.title.label} now uses cluster ${name}`;
    };

    let settings: ISidebarSettings;
    try {
      settings = sidebarSettings();
    } catch (error) {
      console.error((error as Error).message);
      return;
    }
    const panel = new ClusterPanel({ useInNotebook, settings });
    panel.id = PANEL_ID;
    panel.title.icon = clusterIcon;
    app.shell.add(panel, 'left', { rank: 210 });
    restorer?.add(panel, PANEL_ID);

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show Dask Clusters (nbcluster)',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.useInNotebook, {
      label: 'Use nbcluster Cluster in This Notebook',
      isEnabled: () => !!notebooks?.currentWidget,
      execute: args => useInNotebook(String(args.name))
    });
    palette?.addItem({ command: CommandIDs.open, category: 'nbcluster' });
  }
};

export default plugin;
