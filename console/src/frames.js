// Raw frames: every SSE frame the console receives, as it arrived (browser tools do not show
// fetch-streamed SSE). A fetch for the agent tees each event-stream body: one branch goes to
// the official client, the other is read here. Each frame keeps its id, arrival time, type and
// data; a note from the client (a verification error) is shown next to the frame it concerns.

const frames = [];
const LIMIT = 5000;
let selected = null;
let filter = "";

const rows = () => document.getElementById("frame-rows");

/** A fetch for the agent that copies every event stream into the frame list. */
export async function tappingFetch(url, init) {
  const res = await fetch(url, init);
  const type = res.headers.get("content-type") ?? "";
  if (!res.body || !type.startsWith("text/event-stream")) return res;
  const [mine, theirs] = res.body.tee();
  read(mine).catch(() => {});
  return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
}

async function read(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
    let end;
    while ((end = text.search(/\r?\n\r?\n/)) >= 0) {
      const block = text.slice(0, end);
      text = text.slice(end).replace(/^\r?\n\r?\n/, "");
      add(block);
    }
  }
}

function add(block) {
  let id = "";
  const data = [];
  let comment = null;
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith(":")) comment = line.slice(1).trim();
    else if (line.startsWith("id:")) id = line.slice(3).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  const raw = data.join("\n");
  let json = null;
  try {
    json = raw ? JSON.parse(raw) : null;
  } catch {
    json = null;
  }
  // A CUSTOM event is shown with its name: that is what tells the gateway's apart.
  const type = json?.type
    ? `${json.type}${json.type === "CUSTOM" && json.name ? ` ${json.name}` : ""}`
    : comment !== null ? `: ${comment}` : "(not JSON)";
  frames.push({ n: frames.length + 1, id, at: new Date(), type, json, raw, note: null });
  if (frames.length > LIMIT) frames.shift();
  render();
}

/** Marks the newest frame with `note` (the client's verdict on it). */
export function noteLast(note) {
  const last = frames.at(-1);
  if (!last) return;
  last.note = note;
  render();
}

export function count() {
  return frames.length;
}

export function setFilter(text) {
  filter = text.trim().toUpperCase();
  render();
}

export function clear() {
  frames.length = 0;
  selected = null;
  document.getElementById("frame-detail").textContent = "";
  render();
}

/** The frames as NDJSON, one line each: `{n, id, at, type, data, note}`. */
export function ndjson() {
  return frames
    .map((f) => JSON.stringify({ n: f.n, id: f.id, at: f.at.toISOString(), type: f.type, data: f.json ?? f.raw, note: f.note }))
    .join("\n");
}

export function exportFile() {
  const blob = new Blob([ndjson() + "\n"], { type: "application/x-ndjson" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `frames-${new Date().toISOString().replaceAll(":", "-")}.ndjson`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function show(f) {
  selected = f.n;
  const detail = document.getElementById("frame-detail");
  detail.textContent = (f.note ? `client: ${f.note}\n\n` : "") + (f.json ? JSON.stringify(f.json, null, 2) : f.raw);
  render();
}

let pending = false;
function render() {
  // One redraw a frame of the screen, however many frames arrive.
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const body = rows();
    const shown = frames.filter((f) => !filter || f.type.toUpperCase().includes(filter));
    body.replaceChildren(
      ...shown.slice(-500).map((f) => {
        const tr = document.createElement("tr");
        tr.tabIndex = 0;
        tr.className = [f.note ? "noted" : "", f.n === selected ? "selected" : ""].join(" ").trim();
        for (const v of [f.n, f.id, f.at.toISOString().slice(11, 23), f.type + (f.note ? " ⚠" : "")]) {
          const td = document.createElement("td");
          td.textContent = String(v);
          tr.append(td);
        }
        tr.addEventListener("click", () => show(f));
        tr.addEventListener("keydown", (e) => {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            show(f);
          }
        });
        return tr;
      }),
    );
  });
}
