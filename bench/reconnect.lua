-- wrk script for the reconnect benchmark (bench/bench.py runs it; see docs/benchmarks.md).
-- Each request is GET .../processes/PID/events?after=N with N random in [0, LAST-1]; each
-- reply is checked byte for byte against the slice of the full replay (after=0) that starts
-- at the first event with seq > N. Which N a reply answers is read from its first event's
-- seq; the histograms of requested and answered N must then match (up to the requests still
-- in flight when wrk stops), so a reply that starts one event early or late is caught too.
-- Environment: COVE_PATH (…/events?after=), COVE_KEY, COVE_FULL (file: the after=0 body),
-- COVE_LAST (last seq), COVE_TAIL (see below).
local path = os.getenv("COVE_PATH")
local last = tonumber(os.getenv("COVE_LAST"))
-- COVE_TAIL=K: reattach near the end (after=N in [LAST-K, LAST-1]), the usual reconnect of a
-- client that lost its connection for a moment; 0: anywhere (a full replay on average half)
tail = tonumber(os.getenv("COVE_TAIL") or "0")
wrk.headers["Authorization"] = "Bearer " .. os.getenv("COVE_KEY")

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

-- per thread state
-- (globals, so that done() can read them with thread:get)
suffix = {}   -- suffix[s] = the expected bytes of a reply starting at seq s
asked = {}    -- asked[n] = how many requests had after=n
got = {}      -- got[n] = how many correct replies answered after=n
good, bad, badbytes, sent = 0, 0, 0, 0

function init(args)
  local f = assert(io.open(os.getenv("COVE_FULL"), "rb"))
  local full = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #full do
    local e = full:find("\n", pos, true)
    local line = full:sub(pos, e)
    local s = tonumber(line:match('"seq":(%d+)'))
    suffix[s] = full:sub(pos)
    pos = e + 1
  end
  for n = 0, last - 1 do asked[n] = 0; got[n] = 0 end
  math.randomseed(os.time() + tonumber(tostring(args):match("0x(%x+)") or "1", 16) % 100000)
end

function request()
  local n = math.random(tail > 0 and math.max(0, last - tail) or 0, last - 1)
  asked[n] = asked[n] + 1
  sent = sent + 1
  return wrk.format("GET", path .. n)
end

function response(status, headers, body)
  local s = tonumber(body:match('"seq":(%d+)') or "0")
  if status == 200 and s > 0 and suffix[s] == body then
    good = good + 1
    got[s - 1] = got[s - 1] + 1
  else
    bad = bad + 1
    badbytes = badbytes + #body
  end
end

function done(summary, latency, requests)
  local g, b, bb, snt, mism = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    g = g + t:get("good")
    b = b + t:get("bad")
    bb = bb + t:get("badbytes")
    snt = snt + t:get("sent")
  end
  -- histogram check: sum over n of |asked - got| (in-flight requests at the stop account for
  -- at most one per connection; the rest would be replies that started at the wrong seq)
  local ta, tg = {}, {}
  for _, t in ipairs(threads) do
    local a, gg = t:get("asked"), t:get("got")
    for n = 0, last - 1 do
      ta[n] = (ta[n] or 0) + a[n]
      tg[n] = (tg[n] or 0) + gg[n]
    end
  end
  for n = 0, last - 1 do mism = mism + math.abs(ta[n] - tg[n]) end
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"good":%d,"bad":%d,"bad_bytes":%d,"sent":%d,' ..
    '"hist_mismatch":%d,"errors_connect":%d,"errors_read":%d,"errors_write":%d,' ..
    '"errors_status":%d,"errors_timeout":%d,"lat_p50_us":%d,"lat_p99_us":%d}\n',
    summary.requests, summary.duration, g, b, bb, snt, mism, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end

-- COVE_NOCHECK=1: no per-reply check (wrk then skips reading bodies into Lua); only to show
-- what the verification itself costs the client
if os.getenv("COVE_NOCHECK") == "1" then response = nil end
