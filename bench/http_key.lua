-- wrk script: POST a small JSON body to the given path with a fresh Idempotency-Key per
-- request (unique across wrk's threads); BENCH_PATH (default /requests) and, when set, the
-- partner's token BENCH_PO_TOKEN from the environment.
local counter = 0
prefix = ""
local token = os.getenv("BENCH_PO_TOKEN")
local path = os.getenv("BENCH_PATH") or "/requests"
local body = '{"company_id":"C-1","document_type":"PO","currency":"EUR",' ..
             '"lines":[{"item":"bolt","quantity":"10","unit_price":"0.25"}]}'

function setup(thread)
   counter = counter + 1
   thread:set("prefix", "t" .. counter .. "-" .. os.time() .. "-")
end

function request()
   counter = counter + 1
   local headers = {
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = prefix .. counter,
   }
   if token then
      headers["Authorization"] = "Bearer " .. token
   end
   return wrk.format("POST", path, headers, body)
end
