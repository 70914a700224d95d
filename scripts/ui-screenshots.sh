#!/usr/bin/env bash
# Screenshots of what the MLflow UI shows of a sweep (docs/monitoring.md), taken by headless
# Chromium from the OS packages (apt-get install chromium); not run in CI.
#
#   scripts/ui-screenshots.sh [SWEEP] [OUT_DIR]     (defaults: demo, docs/img)
#
# After `make demo` (or any finished sweep in $SCALELAB_HOME): starts `scalelab ui` on a free
# port of 127.0.0.1, saves ui-experiment.png (what the experiment opens on, reached without
# the printed address's settings), ui-runs.png (the saved view `scalelab-trials`: the trials
# by variant), ui-charts.png (its charts), ui-trial.png (one trial's run),
# ui-parent-artifacts.png (the parent run's loss-vs-FLOPs plot) and ui-report.png (its
# report.html), then stops the UI. Each picture is taken by a fresh browser profile.
set -euo pipefail
cd "$(dirname "$0")/.."

SWEEP=${1:-demo}
OUT=${2:-docs/img}
PY=${PYTHON:-.venv/bin/python}
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "needs Chromium: apt-get install chromium" >&2; exit 2; }
mkdir -p "$OUT"

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
# --no-login: headless Chromium's --screenshot cannot answer a login prompt, so while this
# runs (a minute or so) the UI is open to every user of the machine, as it warns
setsid "$PY" -m scalelab.cli.main ui "$SWEEP" --port "$PORT" --no-login >"$OUT/.ui.log" 2>&1 &
UI=$!
trap 'kill -TERM -- -$UI 2>/dev/null || true; rm -f "$OUT/.ui.log"' EXIT
"$PY" - "$BASE" <<'EOF' || { cat "$OUT/.ui.log" >&2; exit 1; }
import sys, time, urllib.request
for _ in range(300):  # MLflow's first start can take a while on a busy machine
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("the MLflow UI did not answer")
EOF

# the experiment, a trial's run and the parent run, through the REST API the UI reads
read -r EID TRIAL PARENT < <("$PY" - "$BASE" "$SWEEP" <<'EOF'
import json, sys, urllib.parse, urllib.request
base, sweep = sys.argv[1:]
def get(route, **q):
    url = f"{base}/api/2.0/mlflow/{route}?{urllib.parse.urlencode(q)}"
    return json.load(urllib.request.urlopen(url, timeout=30))
exp = get("experiments/get-by-name", experiment_name=sweep)["experiment"]
body = json.dumps({"experiment_ids": [exp["experiment_id"]], "max_results": 1000}).encode()
req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                             headers={"Content-Type": "application/json"})
runs = json.load(urllib.request.urlopen(req, timeout=30))["runs"]
tags = lambda r: {t["key"]: t["value"] for t in r["data"].get("tags", [])}
parent = next(r for r in runs if tags(r).get("scalelab.role") == "sweep")
trial = next(r for r in runs if tags(r).get("scalelab.role") == "trial")
print(exp["experiment_id"], trial["info"]["run_id"], parent["info"]["run_id"])
EOF
)

PROFILES=$(mktemp -d)
shot() {  # name, URL fragment; a fresh profile: what a first visit shows
  "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$(mktemp -d -p "$PROFILES")" --window-size=1600,1000 \
    --virtual-time-budget=120000 --screenshot="$OUT/$1.png" "$BASE/$2" >/dev/null 2>&1
  echo "$OUT/$1.png"
}
VIEW="viewStateShareKey=scalelab-trials"  # the saved view (orchestrator/ledger/ui_view.py)
shot ui-experiment "#/experiments/$EID"  # no workflowType: the experiments list's link
shot ui-runs "#/experiments/$EID/runs?$VIEW"
shot ui-charts "#/experiments/$EID/runs?$VIEW&compareRunsMode=CHART"
shot ui-trial "#/experiments/$EID/runs/$TRIAL"
shot ui-parent-artifacts "#/experiments/$EID/runs/$PARENT/artifacts/plots/loss_vs_flops.png"
shot ui-report "#/experiments/$EID/runs/$PARENT/artifacts/report.html"
rm -rf "$PROFILES"
