-- Template categories: P:tcat hash "<name> <language>" -> the category as Meta spells it, and
-- P:tcatat the same field -> when Meta said it (ms). The newer word wins (store/rules/category.rs,
-- `replaces`): an older one is dropped here, in one step with the read.
local function category_keep(a)
  local field = a.name .. ' ' .. a.language
  local kept = tonumber(redis.call('HGET', k('tcatat'), field))
  if kept and a.heard_at < kept then
    return false
  end
  redis.call('HSET', k('tcat'), field, a.category)
  redis.call('HSET', k('tcatat'), field, int(a.heard_at))
  return true
end

local function category_get(a)
  return redis.call('HGET', k('tcat'), a.name .. ' ' .. a.language) or cjson.null
end
