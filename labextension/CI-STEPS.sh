#!/usr/bin/env bash
# CI steps for the sidebar panel (labextension) and the server extension, from a clean
# clone. Needs Node >= 20 on PATH at build time only (users install a prebuilt wheel).
set -euxo pipefail

# 1. Headless browser for tests/test_panel_browser.py (playwright cannot download one here).
apt-get update
apt-get install -y --no-install-recommends chromium
test -x /usr/bin/chromium

# 2. Install nbcluster; the hatch-jupyter-builder hook builds the extension on the way:
#    jlpm install (CI=true makes it immutable: it uses the committed labextension/yarn.lock)
#    then jlpm build (editable) / jlpm build:prod (wheel), output in nbcluster/labextension.
export CI=true
python -m pip install -e ".[test]"
test -f nbcluster/labextension/package.json
test -f nbcluster/labextension/static/style.js

#    Without the hook (e.g. to rebuild after editing labextension/src):
#    (cd labextension && jlpm install && jlpm build:prod)

# 3. Lint and tests. The browser tests fail (never skip) without a build or Chromium.
ruff check nbcluster/server tests/test_server.py tests/test_panel_browser.py tests/browser_helpers.py
(cd labextension && jlpm tsc --noEmit)
python -m pytest tests/test_server.py tests/test_panel_browser.py

# 4. Keep the screenshots and the jupyter lab log as CI artifacts:
#    test-artifacts/<test name>/*.png and test-artifacts/jupyter-lab.log
ls -R test-artifacts
