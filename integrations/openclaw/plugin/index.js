// clawloop's OpenClaw plugin: every call OpenClaw makes to the `clawloop` provider carries
//
//   X-Session-Id: openclaw-<OpenClaw's session id>   (resolveTransportTurnState)
//   X-Turn-Type:  main | side                        (wrapStreamFn)
//
// so that clawloop puts the turns of one OpenClaw session in one session, links each answer to the
// user's next message, and keeps OpenClaw's own background calls out of training. Why a plugin: with
// its default profile OpenClaw rewrites the history it sends (a compaction summary replaces the early
// turns, an "internal context" message follows the user's), so clawloop cannot tie the turns together
// from the conversation alone, and cannot tell a memory flush from a turn.
//
// main vs side. OpenClaw runs its model calls inside agent runs, each started by a trigger; the
// `before_model_resolve` hook tells us each run's id and trigger before its first call, and each call
// carries its run in its request id (`<runId>:model:<n>`; a compaction summary's is
// `<runId>:compaction:<id>:model:<n>`). A call is
//   side  a compaction summary, or a call of a run whose trigger is not "user" (the pre-compaction
//         memory flush is trigger "memory"; heartbeats, cron jobs, manual runs likewise);
//   main  a call of a "user" run (the reply, and its tool-call follow-ups), or one we cannot place,
//         which is clawloop's own default (classify side only on evidence).
// The session is the id OpenClaw's transport is given for the call: the user's session also for the
// memory flush (which runs in an internal session of its own) and the compaction summary. The
// `anthropic-messages` transport has no turn-state hook: there the header comes from the call's own
// options, which a compaction summary lacks (seen on openai-completions), so such a summary would go
// without it and clawloop would store it as a one-turn side session (not tested).
//
// Install: see README.md (`openclaw plugins install --link`, then grant conversation hooks).

const SESSION_PREFIX = "openclaw-";
const MAIN_TRIGGERS = new Set(["user"]);
const MAX_RUNS = 1024;

/** Agent runs seen, runId -> trigger, oldest first (bounded: a gateway runs for months). */
const runs = new Map();

function rememberRun(runId, trigger) {
  if (!runId) return;
  runs.delete(runId);
  runs.set(runId, trigger ?? "");
  if (runs.size > MAX_RUNS) runs.delete(runs.keys().next().value);
}

/** The trigger of the run a call belongs to: null for a compaction summary, undefined when unknown. */
function triggerOf(requestId, knownRuns) {
  if (requestId.includes(":compaction:")) return null;
  for (const [runId, trigger] of knownRuns) {
    if (requestId.startsWith(runId + ":")) return trigger;
  }
  return undefined;
}

/** "main" or "side" for one model call, from the request id OpenClaw gives it (see the top). */
export function turnType(requestId, knownRuns = runs) {
  if (typeof requestId !== "string" || requestId === "") return "main";
  const trigger = triggerOf(requestId, knownRuns);
  if (trigger === undefined) return "main";
  return MAIN_TRIGGERS.has(trigger) ? "main" : "side";
}

export function sessionHeader(sessionId) {
  return sessionId ? { "X-Session-Id": SESSION_PREFIX + sessionId } : undefined;
}

export default {
  id: "clawloop",
  name: "clawloop session headers",
  description: "X-Session-Id and X-Turn-Type on every call to the clawloop provider",
  register(api) {
    let warned = false;
    api.on("before_model_resolve", (_event, ctx) => {
      rememberRun(ctx?.runId, ctx?.trigger);
    });
    api.registerProvider({
      id: "clawloop",
      label: "clawloop",
      auth: [],
      resolveTransportTurnState: (ctx) => {
        const headers = sessionHeader(ctx.sessionId);
        return headers ? { headers } : undefined;
      },
      wrapStreamFn: (ctx) => {
        const inner = ctx.streamFn;
        if (!inner) return undefined;
        return (model, context, options) => {
          const requestId = options?.requestId;
          if (!warned && typeof requestId === "string" && triggerOf(requestId, runs) === undefined) {
            warned = true;  // the hook that names the runs is blocked, or OpenClaw changed its ids
            api.logger?.warn?.(`clawloop: call ${requestId} is in no agent run seen; is plugins.entries.`
                               + "clawloop.hooks.allowConversationAccess true? Unplaced calls go as main.");
          }
          // The session header again where the call names its session: transports without the turn-state
          // hook (anthropic-messages) send it too; where both apply they agree (same id, same header name).
          const headers = { ...options?.headers, ...sessionHeader(options?.sessionId), "X-Turn-Type": turnType(requestId) };
          return inner(model, context, { ...options, headers });
        };
      },
    });
  },
};
