-- wrk script: POST /requests with a fresh Idempotency-Key per request (unique across wrk's
-- threads) and the partner's token from the environment.
local counter = 0
prefix = ""
local token = os.getenv("BENCH_PO_TOKEN")
local body = '{"company_id":"C-1","document_type":"PO","currency":"EUR",' ..
             '"lines":[{"item":"bolt","quantity":"10","unit_price":"0.25"}]}'

function setup(thread)
   counter = counter + 1
   thread:set("prefix", "t" .. counter .. "-" .. os.time() .. "-")
end

function request()
   counter = counter + 1
   return wrk.format("POST", "/requests", {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. token,
      ["Idempotency-Key"] = prefix .. counter,
   }, body)
end
