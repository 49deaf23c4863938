-- wrk script: POST a small JSON body to the given path with a fresh Idempotency-Key per
-- request (unique across wrk's threads); BENCH_PATH (default /requests) and, when set, the
-- partner's token BENCH_PO_TOKEN from the environment. With BENCH_REPLAY_KEYS=N the keys are
-- replay-0 … replay-(N-1), the same across threads and runs: once a first run stored them,
-- every request is the replay of a stored response (same key, same body).
local counter = 0
prefix = ""
local token = os.getenv("BENCH_PO_TOKEN")
local path = os.getenv("BENCH_PATH") or "/requests"
local replay = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "")
local body = '{"company_id":"C-1","document_type":"PO","currency":"EUR",' ..
             '"lines":[{"item":"bolt","quantity":"10","unit_price":"0.25"}]}'

function setup(thread)
   counter = counter + 1
   thread:set("prefix", "t" .. counter .. "-" .. os.time() .. "-")
end

function request()
   counter = counter + 1
   local key = prefix .. counter
   if replay then
      key = "replay-" .. (counter % replay)
   end
   local headers = {
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = key,
   }
   if token then
      headers["Authorization"] = "Bearer " .. token
   end
   return wrk.format("POST", path, headers, body)
end
