-- wrk script: one event appended per request to the span `evspan` (create it first:
--   curl -XPOST localhost:18080/v1/activity/spans -H 'content-type: application/json' \
--     -d '{"spanId":"evspan","runId":"evrun","name":"x","kind":"turn","origin":"session"}'
-- then: wrk -t2 -c64 -d5s -s crates/flightlog-loadgen/wrk/append-event.lua http://127.0.0.1:18080
request = function()
  return wrk.format("POST", "/v1/activity/spans/evspan/events",
    {["Content-Type"] = "application/json"},
    '{"eventType":"tool.output","payload":{"result":"the weather in paris is sunny, 21 degrees, light wind from the west","tokens":123}}')
end
