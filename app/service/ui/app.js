// The occupancy page: draws GET /inventory (a summary per GPU model, the pending pods linked
// to their explanation, GPU cells per node with a memory bar per shared GPU, the CPU-only
// nodes apart, IP pools, gangs, each team quota's min/used/max bars) and refreshes it every
// 2 s. Plain DOM calls only: the page is served with Content-Security-Policy default-src
// 'self', so no inline script, no inline style attributes and no third-party code. Cluster
// data always goes in through textContent or attributes, never as HTML.
//
// Hundreds of nodes: the node filters (name, model, pool, free GPUs; kept in the URL's query,
// so a filtered view can be shared) narrow the cards, at most NODE_PAGE cards are drawn until
// asked for more, and a card is rebuilt only when its node changed since the last refresh.
"use strict";

(() => {
  const REFRESH_MS = 2000;
  const FETCH_TIMEOUT_MS = 5000;
  // Marked once the first inventory is drawn: its startTime is the time from navigation to
  // data on screen (the ui tests hold it under a bound).
  const DRAWN_MARK = "schedext:drawn";

  // Cards drawn at once, and added per "show more": enough to scroll through, few enough
  // that a refresh of a 1000-node cluster stays quick.
  const NODE_PAGE = 200;

  let lastBody = null;
  let inFlight = false;
  let current = null; // the inventory drawn last
  let shownLimit = NODE_PAGE;
  // Per node name: the node's JSON when its card was built, and the card.
  const cards = new Map();
  const filters = readFilters(new URLSearchParams(window.location.search));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child);
    }
    return node;
  }

  // FNV-1a over the pod key, then murmur3's finalizer to spread similar names apart: the
  // same pod gets the same colour on every refresh, on every node and in every browser.
  function hash(text) {
    let h = 0x811c9dc5;
    for (let i = 0; i < text.length; i++) {
      h ^= text.charCodeAt(i);
      h = Math.imul(h, 0x01000193);
    }
    h ^= h >>> 16;
    h = Math.imul(h, 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
    return h >>> 0;
  }

  function holderColour(pod) {
    const h = hash(pod);
    // 24 hues 15 degrees apart times 3 lightness steps, in OKLCH so that a blue is as light
    // as a yellow: neighbours stay tellable apart and every step carries dark text.
    const hue = (h % 24) * 15;
    const lightness = [0.74, 0.81, 0.88][(h >>> 8) % 3];
    return `oklch(${lightness} 0.13 ${hue})`;
  }

  function count(n, noun) {
    return `${n} ${noun}${n === 1 ? "" : "s"}`;
  }

  function cores(milli) {
    return (milli / 1000).toFixed(milli % 1000 === 0 ? 0 : 1);
  }

  function ranges(indices) {
    // [0, 1, 2, 5] -> "0–2, 5": short enough to read in a legend.
    const parts = [];
    let start = null;
    let prev = null;
    for (const i of [...indices].sort((a, b) => a - b)) {
      if (start === null) {
        start = prev = i;
      } else if (i === prev + 1) {
        prev = i;
      } else {
        parts.push(start === prev ? `${start}` : `${start}–${prev}`);
        start = prev = i;
      }
    }
    if (start !== null) parts.push(start === prev ? `${start}` : `${start}–${prev}`);
    return parts.join(", ");
  }

  // The scheduler counts GPUs of pods bound without schedext's annotation but cannot know
  // their indices; it assumes they sit on the highest free indices, and so does the page.
  // A GPU that pods hold shares of is not free for a whole-GPU pod either, nor one the node's
  // kubelet reports in use by a container schedext did not place.
  function anonymousIndices(node) {
    const free = node.gpus.filter((g) => g.holder === null && !g.share && !g.inUse).map((g) => g.index);
    const count = Math.min(node.anonymousGpus || 0, free.length);
    return new Set(count > 0 ? free.slice(free.length - count) : []);
  }

  function mib(n) {
    return `${n.toLocaleString("en-US")} MiB`;
  }

  // The memory a shared GPU has in all: the node's GPU memory, or what is held and free when
  // the node does not publish it.
  function shareCapacity(node, share) {
    return node.gpuMemoryMiB || share.memoryMiB + share.memoryFreeMiB;
  }

  function percent(part, whole) {
    return `${whole > 0 ? Math.min(100, (100 * part) / whole) : 0}%`;
  }

  function gpuCell(gpu, anonymous, node) {
    const held = gpu.holder !== null;
    const share = gpu.share;
    // In use by a container schedext did not place, as the node's kubelet reports it: held.
    const outside = !held && Boolean(gpu.inUse);
    const state = held ? "held" : outside ? "outside" : share ? "shared" : anonymous ? "anonymous" : "free";
    const classes = ["gpu-cell", state];
    if (gpu.reserved) classes.push("reserved");
    let title;
    if (outside) {
      title = gpu.inUse; // names the GPU already
    } else if (held) {
      title = `GPU ${gpu.index}: ${gpu.holder}${gpu.reserved ? " (reserved, bind in progress)" : ""}`;
    } else if (share) {
      const pods = share.pods.map((p) => p.pod).join(", ");
      title =
        `GPU ${gpu.index}: shared by ${pods}; ${mib(share.memoryMiB)} of ` +
        `${mib(shareCapacity(node, share))} held, ${mib(share.memoryFreeMiB)} free`;
    } else if (anonymous) {
      title = `GPU ${gpu.index}: assumed held by a pod without schedext's annotation`;
    } else {
      title = `GPU ${gpu.index}: free`;
    }
    const cell = el(
      "span",
      {
        class: classes.join(" "),
        role: "img",
        title,
        "aria-label": title,
        "data-index": gpu.index,
        "data-holder": held ? gpu.holder : "",
        "data-reserved": gpu.reserved ? "true" : "false",
        "data-anonymous": anonymous ? "true" : "false",
        "data-outside": outside ? "true" : "false",
        "data-shared": share ? "true" : "false",
      },
      el("span", { class: "gpu-index", "aria-hidden": "true", text: gpu.index }),
    );
    // CSSOM writes are allowed under the CSP; a style="" attribute would not be.
    if (held) cell.style.setProperty("--holder", holderColour(gpu.holder));
    // A shared cell fills from the bottom as its memory is held.
    if (share) cell.style.setProperty("--held", percent(share.memoryMiB, shareCapacity(node, share)));
    return cell;
  }

  // Per shared GPU, a bar of its memory: one segment per pod holding a share (in the pod's
  // colour, named in its title), the rest free.
  function shareBars(node) {
    const shared = node.gpus.filter((g) => g.share);
    if (shared.length === 0) return null;
    const list = el("ul", { class: "share-bars", "aria-label": `GPU shares on ${node.name}` });
    for (const gpu of shared) {
      const share = gpu.share;
      const capacity = shareCapacity(node, share);
      const label =
        `GPU ${gpu.index}: ${mib(share.memoryMiB)} of ${mib(capacity)} held by ` +
        `${count(share.pods.length, "share")}, ${mib(share.memoryFreeMiB)} free`;
      const bar = el("div", { class: "share-bar", role: "img", "aria-label": label, title: label });
      for (const pod of share.pods) {
        const cores = pod.cores ? `, ${pod.cores}% of the cores` : "";
        const text = `${pod.pod}: ${mib(pod.memoryMiB)}${cores}${pod.reserved ? " (reserved)" : ""}`;
        const segment = el("div", {
          class: `share-segment${pod.reserved ? " reserved" : ""}`,
          title: text,
          "data-pod": pod.pod,
          "data-memory": pod.memoryMiB,
          "data-cores": pod.cores,
        });
        segment.style.width = percent(pod.memoryMiB, capacity);
        segment.style.setProperty("--holder", holderColour(pod.pod));
        bar.append(segment);
      }
      const figures = `${share.memoryMiB}/${capacity} MiB` + (share.cores ? ` · ${share.cores}% cores` : "");
      list.append(
        el(
          "li",
          {
            class: "share-row",
            "data-index": gpu.index,
            "data-held": share.memoryMiB,
            "data-free": share.memoryFreeMiB,
            "data-capacity": capacity,
            "data-cores": share.cores,
          },
          el("span", { class: "share-gpu", text: `GPU ${gpu.index}` }),
          bar,
          el("span", { class: "share-figures", text: figures }),
        ),
      );
    }
    return list;
  }

  function gpuLayout(node) {
    const anonymous = anonymousIndices(node);
    const groups = new Map();
    const ungrouped = [];
    for (const gpu of node.gpus) {
      if (gpu.group === null || gpu.group === undefined) {
        ungrouped.push(gpu);
      } else {
        if (!groups.has(gpu.group)) groups.set(gpu.group, []);
        groups.get(gpu.group).push(gpu);
      }
    }
    const layout = el("div", { class: "gpu-layout" });
    for (const group of [...groups.keys()].sort((a, b) => a - b)) {
      const gpus = groups.get(group);
      const label = `NVLink/NUMA group ${group}: GPUs ${ranges(gpus.map((g) => g.index))}`;
      layout.append(
        el(
          "div",
          { class: "gpu-group", role: "group", "aria-label": label, title: label, "data-group": group },
          el("span", { class: "group-label", text: `group ${group}` }),
          el("div", { class: "gpu-cells" }, ...gpus.map((g) => gpuCell(g, anonymous.has(g.index), node))),
        ),
      );
    }
    if (ungrouped.length > 0) {
      const label = groups.size > 0 ? "not in a group" : "no NVLink/NUMA groups";
      layout.append(
        el(
          "div",
          { class: "gpu-ungrouped", role: "group", "aria-label": `GPUs ${label}` },
          el("span", { class: "group-label", text: label }),
          el("div", { class: "gpu-cells" }, ...ungrouped.map((g) => gpuCell(g, anonymous.has(g.index), node))),
        ),
      );
    }
    return layout;
  }

  function holderLegend(node) {
    const byHolder = new Map();
    const entryOf = (pod, share) => {
      if (!byHolder.has(pod)) byHolder.set(pod, { indices: [], reserved: false, share });
      return byHolder.get(pod);
    };
    for (const gpu of node.gpus) {
      if (gpu.holder !== null) {
        const entry = entryOf(gpu.holder, null);
        entry.indices.push(gpu.index);
        entry.reserved = entry.reserved || gpu.reserved;
      }
      for (const pod of gpu.share ? gpu.share.pods : []) {
        const entry = entryOf(pod.pod, pod);
        entry.indices.push(gpu.index);
        entry.reserved = entry.reserved || pod.reserved;
      }
    }
    if (byHolder.size === 0) return null;
    const list = el("ul", { class: "holder-legend", "aria-label": `Pods holding GPUs on ${node.name}` });
    for (const pod of [...byHolder.keys()].sort()) {
      const { indices, reserved, share } = byHolder.get(pod);
      const swatch = el("span", { class: `key-swatch held${reserved ? " reserved" : ""}`, "aria-hidden": "true" });
      swatch.style.setProperty("--holder", holderColour(pod));
      const gpus = `GPU${indices.length > 1 ? "s" : ""} ${ranges(indices)}`;
      let what = ` ${gpus}`;
      if (share) {
        const each = indices.length > 1 ? " each" : "";
        const cores = share.cores ? `, ${share.cores}% cores` : "";
        what = ` ${gpus} · share ${mib(share.memoryMiB)}${cores}${each}`;
      }
      list.append(
        el(
          "li",
          { class: `holder-entry${share ? " share-entry" : ""}`, "data-holder": pod },
          swatch,
          el("span", { class: "holder-name", text: pod }),
          el("span", { class: "holder-gpus", text: `${what}${reserved ? " (reserved)" : ""}` }),
        ),
      );
    }
    return list;
  }

  function migProfiles(node) {
    return Object.entries(node.mig || {}).sort(([a], [b]) => a.localeCompare(b));
  }

  // A node with GPU hardware: whole GPUs, GPUs cut into MIG devices only, or DRA devices.
  function isGpuNode(node) {
    return node.gpus.length > 0 || migProfiles(node).length > 0 || Boolean(node.dra);
  }

  // Who hands out the node's GPUs (docs/dra.md): shown where it is not the device plugin.
  const OWNERS = { dra: "GPUs by DRA", mixed: "GPUs by device plugin and DRA (mixed)" };

  // The node's owner and its DRA devices: held by claims, of those advertised.
  function draFacts(node) {
    const facts = [];
    const owner = node.gpuOwner || "device-plugin";
    if (OWNERS[owner]) {
      facts.push(el("span", { class: `gpu-owner owner-${owner}`, "data-owner": owner, text: OWNERS[owner] }));
    }
    const dra = node.dra;
    if (dra) {
      const text = `DRA ${dra.held}/${dra.advertised} held` + (dra.unknown > 0 ? `, ${dra.unknown} unknown` : "");
      const title = (dra.heldDevices || [])
        .map((d) => `${d.name}: ${d.claims.join(", ")}` + (d.gpu === null ? ` (not counted: ${d.unmapped})` : ` (GPU ${d.gpu})`))
        .join("\n");
      facts.push(
        el("span", {
          class: "dra-devices",
          "data-held": dra.held,
          "data-advertised": dra.advertised,
          "data-unknown": dra.unknown,
          title: title || null,
          text,
        }),
      );
    }
    return facts;
  }

  function modelOf(node) {
    if (!node.gpuModel && node.gpus.length === 0 && node.dra) return "DRA devices only";
    return node.gpuModel || "unknown GPU model";
  }

  function nodeCard(node) {
    const total = node.gpus.length;
    const card = el("article", {
      class: `node-card${total === 0 ? " cpu-only" : ""}`,
      "data-node": node.name,
      "data-gpus": total,
      "data-free": node.freeGpus,
      "data-owner": node.gpuOwner || "device-plugin",
      "aria-label": `Node ${node.name}`,
    });
    const facts = [];
    if (total > 0) {
      facts.push(el("span", { class: "gpu-model", text: node.gpuModel || "unknown GPU model" }));
      facts.push(el("span", { class: "gpu-free", text: `${node.freeGpus}/${total} GPUs free` }));
    } else {
      facts.push(el("span", { class: "gpu-model", text: node.dra ? "no GPUs of schedext's" : "no GPUs" }));
    }
    facts.push(...draFacts(node));
    if (node.cpuMilli) {
      facts.push(
        el("span", {
          class: "cpu",
          text: `CPU ${cores(node.cpuMilli.free)}/${cores(node.cpuMilli.allocatable)} cores free`,
        }),
      );
    }
    card.append(el("h3", { class: "node-name", text: node.name }), el("p", { class: "node-facts" }, ...facts));
    const mig = migProfiles(node);
    if (mig.length > 0) {
      const text = mig.map(([profile, c]) => `${profile} ${c.free}/${c.devices} free`).join(", ");
      card.append(el("p", { class: "node-mig", text: `MIG: ${text}` }));
    }
    if ((node.pools || []).length > 0) {
      card.append(el("p", { class: "node-pools", text: `IP pools: ${node.pools.join(", ")}` }));
    }
    if (node.topologyProblem) {
      card.append(el("p", { class: "topology-problem", role: "note", text: `Topology: ${node.topologyProblem}` }));
    }
    // Where the node's kubelet and schedext disagree (its agent's drift), one line each.
    const drift = node.drift || [];
    if (drift.length > 0) {
      card.append(
        el(
          "ul",
          { class: "node-drift", "aria-label": `Drift on ${node.name}`, "data-count": drift.length },
          ...drift.map((line) => el("li", { class: "drift-line", text: line })),
        ),
      );
    }
    if (node.driftProblem) {
      card.append(el("p", { class: "topology-problem", role: "note", text: `Drift: ${node.driftProblem}` }));
    }
    if (node.anonymousGpus > 0) {
      card.append(
        el("p", {
          class: "anonymous-badge",
          "data-count": node.anonymousGpus,
          text: `${count(node.anonymousGpus, "GPU")} held by pods without schedext's annotation`,
        }),
      );
    }
    if (total > 0) card.append(gpuLayout(node));
    const bars = shareBars(node);
    if (bars) card.append(bars);
    const legend = holderLegend(node);
    if (legend) card.append(legend);
    return card;
  }

  // A bar and its numbers beside it ("5/8 GPUs used"): the numbers, not the fill alone, say it.
  function usageBar(value, extra, max, label, numbers) {
    const bar = el("div", { class: "bar", role: "img", "aria-label": label, title: label });
    const used = el("div", { class: "bar-fill" });
    used.style.width = `${max > 0 ? (100 * value) / max : 0}%`;
    bar.append(used);
    if (extra > 0) {
      const pending = el("div", { class: "bar-fill waiting" });
      pending.style.width = `${max > 0 ? (100 * extra) / max : 0}%`;
      bar.append(pending);
    }
    return el("div", { class: "usage" }, bar, el("span", { class: "bar-text", text: numbers }));
  }

  function poolRow(pool) {
    const selector = Object.entries(pool.nodeSelector || {})
      .map(([k, v]) => `${k}=${v}`)
      .join(", ");
    const holders = el("ul", { class: "pool-holders" });
    for (const h of pool.holders) {
      holders.append(
        el("li", {
          class: "pool-holder",
          "data-address": h.address,
          "data-pod": h.pod,
          text: `${h.address} → ${h.pod}${h.node ? ` (${h.node})` : ""}`,
        }),
      );
    }
    const name = el("th", { scope: "row", class: "pool-name", text: pool.name });
    if (pool.problem) name.append(el("span", { class: "pool-problem", role: "note", text: ` ${pool.problem}` }));
    return el(
      "tr",
      {
        class: "pool-row",
        "data-pool": pool.name,
        "data-used": pool.allocated,
        "data-free": pool.free,
        "data-size": pool.size,
      },
      name,
      el("td", {}, usageBar(pool.allocated, 0, pool.size, `${pool.allocated} of ${pool.size} addresses used`, `${pool.allocated}/${pool.size} addresses used`)),
      el("td", { class: "pool-used num", text: pool.allocated }),
      el("td", { class: "pool-free num", text: pool.free }),
      el("td", { class: "pool-size num", text: pool.size }),
      el("td", { class: "pool-selector", text: selector || "any node" }),
      el("td", {}, pool.holders.length > 0 ? holders : el("span", { class: "empty", text: "none" })),
    );
  }

  // The GPUs held for a gang that waited too long for room (docs/gangs.md): how many, where
  // (the topology domain, or the nodes) and until when; the title says since when it waits.
  // No hold: a dash, titled with why not when schedext knows.
  function holdCell(gang) {
    const hold = gang.hold;
    if (!hold) {
      return el("td", { class: "gang-hold empty", "data-held": "false", title: gang.holdWhyNot || null, text: "\u2014" });
    }
    const nodes = Object.keys(hold.nodes).sort();
    const where = hold.domain
      ? `${hold.level} ${hold.domain}`
      : nodes.slice(0, 4).join(", ") + (nodes.length > 4 ? ` and ${nodes.length - 4} more` : "");
    return el(
      "td",
      {
        class: "gang-hold",
        "data-held": "true",
        "data-gpus": hold.gpus,
        "data-expires": hold.expires,
        title: `waiting since ${hold.waitingSince}; held since ${hold.started}; ${Math.round(hold.idleGpuSeconds)} GPU-seconds idle so far`,
      },
      el("span", { class: "hold-gpus", text: `${hold.gpus} GPUs` }),
      " on ",
      el("span", { class: "hold-where", text: where }),
      el("span", { class: "hold-until", text: `until ${hold.expires}` }),
    );
  }

  function gangRow(gang) {
    // Placed members are bound ones plus those holding a reservation at the bind barrier.
    const placed = gang.scheduled + gang.waiting;
    const scale = Math.max(gang.minMember, placed);
    const quorum = `${placed} of ${gang.minMember} needed placed (${gang.scheduled} bound, ${gang.waiting} waiting)`;
    return el(
      "tr",
      {
        class: "gang-row",
        "data-group": gang.group,
        "data-phase": gang.phase,
        "data-min-member": gang.minMember,
        "data-members": gang.members,
        "data-placed": placed,
        "data-scheduled": gang.scheduled,
        "data-running": gang.running,
        "data-waiting": gang.waiting,
      },
      el("th", { scope: "row", class: "gang-group", text: gang.group }),
      el("td", {}, el("span", { class: `phase phase-${gang.phase.toLowerCase()}`, text: gang.phase })),
      el("td", {}, usageBar(gang.scheduled, gang.waiting, scale, quorum, `${placed}/${gang.minMember} placed`)),
      el("td", { class: "gang-placed num", text: `${placed} / ${gang.minMember}` }),
      el("td", { class: "gang-members num", text: gang.members }),
      el("td", { class: "gang-scheduled num", text: gang.scheduled }),
      el("td", { class: "gang-running num", text: gang.running }),
      el("td", { class: "gang-waiting num", text: gang.waiting }),
      holdCell(gang),
    );
  }

  // One bar per quota and resource, scaled to the max (or, without one, to the larger of min
  // and used): the part used within min, the part borrowed over it, and a mark at min. A
  // resource named in max alone guarantees and borrows nothing: all it uses is one fill.
  function quotaBar(quota, r) {
    const q = r.quantities;
    const scale = r.max !== null ? r.max : Math.max(r.min, r.used);
    const within = r.guarantees ? Math.min(r.used, r.min) : r.used;
    const borrowed = r.used - within;
    const limits = `${r.guarantees ? `min ${q.min}` : "no min"}, ${q.max !== null ? `max ${q.max}` : "no max"}`;
    const label =
      `${quota.quota} ${r.resource}: ${q.used} used; ${limits}` +
      (borrowed > 0 ? `; borrowing over its min` : "");
    const bar = el("div", { class: "bar quota-bar", role: "img", "aria-label": label, title: label });
    const used = el("div", { class: "bar-fill quota-within" });
    used.style.width = percent(within, scale);
    bar.append(used);
    if (borrowed > 0) {
      const over = el("div", { class: "bar-fill quota-borrowed" });
      over.style.width = percent(borrowed, scale);
      bar.append(over);
    }
    if (r.guarantees && scale > 0) {
      const mark = el("div", { class: "quota-min-mark", "aria-hidden": "true" });
      mark.style.left = percent(r.min, scale);
      bar.append(mark);
    }
    return bar;
  }

  function quotaRows(quota) {
    return quota.resources.map((r, i) =>
      el(
        "tr",
        {
          class: `quota-row${i === 0 ? " quota-first" : ""}`,
          "data-quota": quota.quota,
          "data-resource": r.resource,
          "data-unit": r.unit,
          "data-used": r.used,
          "data-min": r.min,
          "data-max": r.max === null ? "" : r.max,
          "data-borrowing": r.guarantees && r.used > r.min ? "true" : "false",
        },
        el("th", { scope: "row", class: "quota-name", text: i === 0 ? quota.quota : "" }),
        el("td", { class: "quota-resource", text: r.resource }),
        el("td", {}, quotaBar(quota, r)),
        el("td", { class: "quota-used num", text: r.quantities.used }),
        el("td", { class: "quota-min num", text: r.guarantees ? r.quantities.min : "none" }),
        el("td", { class: "quota-max num", text: r.quantities.max !== null ? r.quantities.max : "none" }),
      ),
    );
  }

  // ---------------------------------------------------------------- per model and pending

  function modelRows(nodes) {
    const byModel = new Map();
    for (const node of nodes) {
      const model = modelOf(node);
      if (!byModel.has(model)) {
        byModel.set(model, { nodes: 0, gpus: 0, free: 0, unhealthy: 0, shared: 0, migDevices: 0, migFree: 0 });
      }
      const m = byModel.get(model);
      m.nodes += 1;
      m.gpus += node.gpus.length;
      m.free += node.freeGpus;
      m.unhealthy += node.gpus.filter((g) => g.unhealthy).length;
      m.shared += node.sharedGpus || 0;
      for (const [, c] of migProfiles(node)) {
        m.migDevices += c.devices;
        m.migFree += c.free;
      }
    }
    return [...byModel.keys()].sort().map((model) => {
      const m = byModel.get(model);
      const used = m.gpus - m.free;
      const label = `${model}: ${used} of ${count(m.gpus, "GPU")} not free`;
      // The model's name filters the nodes below to it.
      const pick = el("button", { type: "button", class: "model-pick", title: `Show only ${model} nodes`, text: model });
      pick.addEventListener("click", () => {
        filters.model = model;
        filtersChanged();
        document.getElementById("nodes-heading").scrollIntoView();
      });
      return el(
        "tr",
        {
          class: "model-row",
          "data-model": model,
          "data-nodes": m.nodes,
          "data-gpus": m.gpus,
          "data-free": m.free,
          "data-unhealthy": m.unhealthy,
          "data-shared": m.shared,
          "data-mig-devices": m.migDevices,
          "data-mig-free": m.migFree,
        },
        el("th", { scope: "row", class: "model-name" }, pick),
        el("td", { class: "model-nodes num", text: m.nodes }),
        el("td", {}, usageBar(used, 0, m.gpus, label, `${used}/${count(m.gpus, "GPU")} used`)),
        el("td", { class: "model-free num", text: m.free }),
        el("td", { class: "model-gpus num", text: m.gpus }),
        el("td", { class: `model-unhealthy num${m.unhealthy > 0 ? " alarm" : ""}`, text: m.unhealthy }),
        el("td", { class: "model-shared num", text: m.shared }),
        el("td", { class: "model-mig num", text: m.migDevices > 0 ? `${m.migFree} / ${m.migDevices}` : "\u2013", title: m.migDevices > 0 ? null : "no MIG devices" }),
      );
    });
  }

  // What a pending pod asks for, in a few words.
  function asks(pod) {
    const parts = [];
    if (pod.gpus > 0) parts.push(count(pod.gpus, "GPU"));
    if (pod.shares > 0) {
      parts.push(`share of ${mib(pod.shareMemoryMiB)}${pod.shares > 1 ? ` on each of ${pod.shares} GPUs` : ""}`);
    }
    for (const [profile, n] of Object.entries(pod.mig || {}).sort()) parts.push(`${n} × MIG ${profile}`);
    if (parts.length === 0) parts.push("no GPU");
    return parts.join(", ");
  }

  function explainHref(pod) {
    return `/explain/${encodeURIComponent(pod.namespace)}/${encodeURIComponent(pod.name)}`;
  }

  function pendingRow(pod) {
    const address = pod.address || (pod.pools.length > 0 ? `from ${pod.pools.join(", ")}` : "");
    return el(
      "tr",
      { class: "pending-row", "data-pod": pod.pod, "data-group": pod.group || "" },
      el(
        "th",
        { scope: "row", class: "pending-pod" },
        el("a", { class: "explain-link", href: explainHref(pod), title: `Why ${pod.pod} waits, node by node`, text: pod.pod }),
      ),
      el(
        "td",
        { class: "pending-why" },
        // The last filter's reason, linked to the node-by-node explanation.
        el("a", {
          class: "why-link",
          href: explainHref(pod),
          title: `Why ${pod.pod} waits, node by node`,
          text: pod.why || "not turned away by a filter yet",
        }),
      ),
      el("td", { class: "pending-asks", text: asks(pod) }),
      el("td", { class: "pending-model", text: pod.gpuModel || "any" }),
      el("td", { class: "pending-group", text: pod.group || "" }),
      el("td", { class: "pending-address", text: address }),
    );
  }

  // ---------------------------------------------------------------- node filters

  function readFilters(params) {
    return {
      node: (params.get("node") || "").slice(0, 253),
      model: params.get("model") || "",
      pool: params.get("pool") || "",
      free: params.get("free") === "1",
    };
  }

  function matches(node) {
    if (filters.node && !node.name.toLowerCase().includes(filters.node.toLowerCase())) return false;
    if (filters.model && (!isGpuNode(node) || modelOf(node) !== filters.model)) return false;
    if (filters.pool && !(node.pools || []).includes(filters.pool)) return false;
    if (filters.free && node.freeGpus === 0) return false;
    return true;
  }

  // The filters into the form, and into the URL (replaced, not pushed: no history per key).
  function showFilters() {
    document.getElementById("filter-node").value = filters.node;
    document.getElementById("filter-free").checked = filters.free;
    setOptions(document.getElementById("filter-model"), filters.model, current ? modelNames(current) : []);
    setOptions(document.getElementById("filter-pool"), filters.pool, current ? current.pools.map((p) => p.name) : []);
    const params = new URLSearchParams();
    if (filters.node) params.set("node", filters.node);
    if (filters.model) params.set("model", filters.model);
    if (filters.pool) params.set("pool", filters.pool);
    if (filters.free) params.set("free", "1");
    const query = params.toString();
    const url = `${window.location.pathname}${query ? `?${query}` : ""}`;
    if (url !== `${window.location.pathname}${window.location.search}`) window.history.replaceState(null, "", url);
  }

  function modelNames(inventory) {
    return [...new Set(inventory.nodes.filter(isGpuNode).map(modelOf))].sort();
  }

  // Keep the first option ("every …"), then one per value; a chosen value that is gone (a
  // pool deleted, a URL from another cluster) stays listed, so the choice is never silently
  // dropped.
  function setOptions(select, chosen, values) {
    const wanted = [...values];
    if (chosen && !wanted.includes(chosen)) wanted.push(chosen);
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\n") !== wanted.join("\n")) {
      select.replaceChildren(select.options[0], ...wanted.map((v) => el("option", { value: v, text: v })));
    }
    select.value = chosen;
  }

  function filtersChanged() {
    shownLimit = NODE_PAGE;
    showFilters();
    if (current) drawNodes();
  }

  function cachedCard(node) {
    const key = JSON.stringify(node);
    const cached = cards.get(node.name);
    if (cached && cached.key === key) return cached.card;
    const built = nodeCard(node);
    cards.set(node.name, { key, card: built });
    return built;
  }

  function cpuRow(node) {
    const cpu = node.cpuMilli ? `${cores(node.cpuMilli.free)}/${cores(node.cpuMilli.allocatable)} cores` : "";
    return el(
      "tr",
      { class: "cpu-node-row", "data-node": node.name },
      el("th", { scope: "row", class: "cpu-node-name", text: node.name }),
      el("td", { class: "cpu-node-cpu num", text: cpu }),
      el("td", { class: "cpu-node-pools", text: (node.pools || []).join(", ") }),
    );
  }

  function drawNodes() {
    const gpuNodes = current.nodes.filter(isGpuNode);
    const cpuNodes = current.nodes.filter((n) => !isGpuNode(n));
    const gpuShown = gpuNodes.filter(matches);
    const cpuShown = cpuNodes.filter(matches);
    const drawn = gpuShown.slice(0, shownLimit);
    const seen = new Set(drawn.map((n) => n.name));
    for (const name of [...cards.keys()]) if (!seen.has(name)) cards.delete(name);
    document.getElementById("nodes").replaceChildren(...drawn.map(cachedCard));
    const filtered = gpuShown.length < gpuNodes.length;
    let note = `${count(gpuNodes.length, "GPU node")}`;
    if (filtered) note = `${gpuShown.length} of ${note} match the filters`;
    if (drawn.length < gpuShown.length) note += `; showing the first ${drawn.length}`;
    const shown = document.getElementById("nodes-shown");
    shown.textContent = `${note}.`;
    shown.dataset.total = gpuNodes.length;
    shown.dataset.matching = gpuShown.length;
    shown.dataset.drawn = drawn.length;
    const more = document.getElementById("show-more");
    const hiddenCount = gpuShown.length - drawn.length;
    more.hidden = hiddenCount === 0;
    more.textContent = `Show ${Math.min(NODE_PAGE, hiddenCount)} more (${hiddenCount} not shown)`;
    const cpuLimited = cpuShown.slice(0, Math.max(shownLimit, NODE_PAGE));
    document.getElementById("cpu-nodes").replaceChildren(...cpuLimited.map(cpuRow));
    const cpuNote = document.getElementById("cpu-nodes-shown");
    cpuNote.textContent =
      cpuShown.length < cpuNodes.length
        ? `${cpuShown.length} of ${cpuNodes.length} match the filters`
        : `${cpuNodes.length}`;
    cpuNote.dataset.total = cpuNodes.length;
    cpuNote.dataset.matching = cpuShown.length;
  }

  function render(inventory) {
    current = inventory;
    const gpus = inventory.nodes.reduce((sum, n) => sum + n.gpus.length, 0);
    const free = inventory.nodes.reduce((sum, n) => sum + n.freeGpus, 0);
    const shared = inventory.nodes.reduce((sum, n) => sum + (n.sharedGpus || 0), 0);
    document.getElementById("summary").textContent =
      `${count(inventory.nodes.length, "node")} · ${free} of ${count(gpus, "GPU")} free · ` +
      `${count(inventory.pendingPods, "pending pod")} · ` +
      `${count(inventory.reservations, "reservation")}` +
      (shared > 0 ? ` · ${shared} GPU${shared === 1 ? "" : "s"} shared` : "");
    const gpuNodes = inventory.nodes.filter(isGpuNode);
    document.getElementById("models").replaceChildren(...modelRows(gpuNodes));
    document.getElementById("no-models").hidden = gpuNodes.length > 0;
    const cpuOnly = inventory.nodes.length - gpuNodes.length;
    document.getElementById("cpu-count").textContent = `CPU-only nodes: ${cpuOnly} (listed apart, below the GPU nodes).`;
    const pending = inventory.pending || [];
    document.getElementById("pending").replaceChildren(...pending.map(pendingRow));
    document.getElementById("no-pending").hidden = inventory.pendingPods > 0;
    const pendingNote = document.getElementById("pending-note");
    pendingNote.textContent =
      pending.length < inventory.pendingPods
        ? `${inventory.pendingPods} pods wait; the first ${pending.length} by namespace and name are listed.`
        : "";
    showFilters();
    drawNodes();
    document.getElementById("pools").replaceChildren(...inventory.pools.map(poolRow));
    document.getElementById("no-pools").hidden = inventory.pools.length > 0;
    document.getElementById("gangs").replaceChildren(...inventory.gangs.map(gangRow));
    document.getElementById("no-gangs").hidden = inventory.gangs.length > 0;
    const quotas = inventory.quotas || [];
    document.getElementById("quotas").replaceChildren(...quotas.flatMap(quotaRows));
    document.getElementById("no-quotas").hidden = quotas.length > 0;
    document.getElementById("shadowed-quotas").replaceChildren(
      ...(inventory.shadowedQuotas || []).map((s) =>
        el("li", {
          class: "shadowed-quota",
          "data-quota": s.quota,
          "data-by": s.by,
          text: `${s.quota} does not apply: ${s.by} is older and applies to its namespace`,
        }),
      ),
    );
  }

  function showError(message) {
    const banner = document.getElementById("error-banner");
    const shown = document.getElementById("last-updated").textContent;
    const stale = lastBody === null ? "No data yet." : `Showing the data from ${shown}.`;
    banner.textContent = `Could not load /inventory: ${message}. ${stale}`;
    banner.hidden = false;
  }

  // What a refused /inventory says: its JSON Error ("inventory not synced: ..."), else the status.
  async function failure(response) {
    const status = `HTTP ${response.status} ${response.statusText}`.trim();
    try {
      const body = await response.json();
      return body && typeof body.Error === "string" ? `${status}: ${body.Error}` : status;
    } catch {
      return status;
    }
  }

  async function refresh() {
    // A slow server must not pile up requests: skip a tick while one is still out.
    if (inFlight) return;
    inFlight = true;
    try {
      const response = await fetch("/inventory", {
        cache: "no-store",
        headers: { Accept: "application/json" },
        signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
      });
      if (!response.ok) throw new Error(await failure(response));
      const body = await response.text();
      // Redraw only on change, so an open tooltip is not swept away every 2 s.
      if (body !== lastBody) {
        render(JSON.parse(body));
        if (lastBody === null) performance.mark(DRAWN_MARK); // the first data on screen
        lastBody = body;
      }
      const now = new Date();
      const stamp = document.getElementById("last-updated");
      stamp.dateTime = now.toISOString();
      stamp.textContent = now.toLocaleTimeString();
      document.getElementById("error-banner").hidden = true;
    } catch (error) {
      showError(error && error.message ? error.message : String(error));
    } finally {
      inFlight = false;
    }
  }

  function listen() {
    const node = document.getElementById("filter-node");
    node.addEventListener("input", () => {
      filters.node = node.value.slice(0, 253);
      filtersChanged();
    });
    const model = document.getElementById("filter-model");
    model.addEventListener("change", () => {
      filters.model = model.value;
      filtersChanged();
    });
    const pool = document.getElementById("filter-pool");
    pool.addEventListener("change", () => {
      filters.pool = pool.value;
      filtersChanged();
    });
    const free = document.getElementById("filter-free");
    free.addEventListener("change", () => {
      filters.free = free.checked;
      filtersChanged();
    });
    const form = document.getElementById("filters");
    form.addEventListener("submit", (event) => event.preventDefault());
    form.addEventListener("reset", (event) => {
      event.preventDefault();
      Object.assign(filters, { node: "", model: "", pool: "", free: false });
      filtersChanged();
    });
    document.getElementById("show-more").addEventListener("click", () => {
      shownLimit += NODE_PAGE;
      drawNodes();
    });
  }

  listen();
  showFilters();
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
