-- Argo CD health check for tandem.dev/PDDeployment.
--
-- Install: argocd-cm key `resource.customizations.health.tandem.dev_PDDeployment` (see
-- docs/gitops.md). Uses only Lua's base library, so it needs no `useOpenLibs`.
--
-- PDDeployment status is kstatus-compliant: an integer status.observedGeneration and the
-- conditions Ready, Reconciling and Stalled are written from the operator's first pass, and
-- status.phase (Healthy | Progressing | Paused | Degraded) maps 1:1 onto Argo CD health.
-- Order of the rules:
--   1. no status yet, or the operator has not seen the latest generation -> Progressing
--   2. Stalled=True (nothing changes until the spec or the cluster does) -> Degraded
--   3. phase Paused -> Suspended
--   4. Reconciling=True -> Progressing
--   5. KVTransportDegraded=True -> Degraded with its figures (requests are served, Ready stays
--      True, but KV moves slower than the link allows: a silent TCP fallback?)
--   6. phase Degraded -> Degraded
--   7. phase Healthy with Ready=True for this generation -> Healthy
--   8. anything else -> Progressing
-- A rollout (between serving modes, or between revisions of the P/D pair) shows through the phase
-- and conditions the operator derives from it: moving -> Reconciling, paused -> phase Paused,
-- rolled back -> Stalled.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.message
  if text == nil or text == "" then
    text = fallback
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason .. ": " .. text
  end
  return text
end

local status = obj.status
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end

if status == nil or (status.observedGeneration == nil and status.conditions == nil) then
  hs.status = "Progressing"
  hs.message = "Waiting for the tandem operator to report status"
  return hs
end

if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the tandem operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(status, "Ready")
local stalled = condition(status, "Stalled")
local reconciling = condition(status, "Reconciling")

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

if status.phase == "Paused" then
  hs.status = "Suspended"
  hs.message = describe(condition(status, "RolloutProgressing"), "Rollout paused")
  return hs
end

if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end

local kv = condition(status, "KVTransportDegraded")
if kv ~= nil and kv.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(kv, "KV transport degraded")
  return hs
end

if status.phase == "Degraded" then
  hs.status = "Degraded"
  hs.message = describe(ready, "Degraded")
  return hs
end

if status.phase == "Healthy" and ready ~= nil and ready.status == "True" then
  -- A condition may carry its own observedGeneration (metav1.Condition); it must be current too.
  if generation ~= nil and ready.observedGeneration ~= nil and ready.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Waiting for the Ready condition of generation " .. tostring(generation)
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the PDDeployment to become ready")
return hs
