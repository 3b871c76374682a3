-- wrk script: one new tool span per request (28 per run id), for the single-op ceiling of the
-- server with a light client. Usage (server on 127.0.0.1:18080, wrk from Debian's packages):
--   wrk -t2 -c64 -d5s -s crates/flightlog-loadgen/wrk/start-span.lua http://127.0.0.1:18080
local counter = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
request = function()
  counter = counter + 1
  local run = math.floor(counter / 28)
  local body = string.format(
    '{"spanId":"t%d-s%d","runId":"r%d-%d","name":"tool call","kind":"tool","origin":"session",'
      .. '"parentSpanId":"root-%d","attrs":{"tool":"search","input":{"q":"weather in paris"}}}',
    tid, counter, tid, run, run)
  return wrk.format("POST", "/v1/activity/spans", {["Content-Type"] = "application/json"}, body)
end
