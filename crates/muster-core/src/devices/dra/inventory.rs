//! [`Inventory`]: every device of the current ResourceSlices, who holds it, and the queries an
//! admission decision asks (which GPUs of a node a claim may get, the allocation to write).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::NodeSelector as K8sNodeSelector;
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceClassConfiguration, DeviceRequestAllocationResult, DeviceSelector, ResourceClaim, ResourceClaimSpec,
    ResourceSlice,
};

use super::cel::{CelDevice, SelectorCache};
use super::request::{ClaimError, DeviceRequestSet, parse_spec};
use super::{
    CONFIG_SOURCE_CLAIM, CONFIG_SOURCE_CLASS, ClaimKey, DeviceId, Reach, SharedReach, attribute, device_slot,
    is_whole_gpu, node_name_selector, terms_from_k8s,
};
use crate::devices::{GpuSet, MAX_GPUS};

/// Something wrong with a slice, device or claim: the object and why. The object is skipped
/// (or its devices are not offered); the rest of the inventory is unaffected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraProblem {
    /// `ResourceSlice x`, `ResourceSlice x device y`, `pool driver/pool`, `ResourceClaim ns/x`.
    pub object: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for DraProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.why)
    }
}

/// One device of a current pool.
#[derive(Debug)]
struct Entry {
    id: DeviceId,
    reach: Reach,
    /// The node selector behind `Reach::Selector`, as written in the slice.
    selector: Option<K8sNodeSelector>,
    /// The device as selectors see it, or why kube-scheduler could not evaluate selectors on it.
    cel: Result<CelDevice, String>,
    /// Why the device can never be allocated by muster (taint, binding conditions, counters,
    /// incomplete or invalid pool); None when it can.
    blocked: Option<String>,
    /// `(node, GPU index)` for a GPU of the GPU driver local to one node.
    gpu: Option<(String, usize)>,
    /// What the device is, when it is a part of a GPU or a ComputeDomain device (never
    /// offered as a GPU, never allocated by muster).
    partition: Option<Partition>,
}

/// A device published beside the GPUs that muster never allocates: a part of a GPU (a MIG
/// device, any GPU-driver device whose `type` is not `gpu`) or a ComputeDomain device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Partition {
    /// A GPU-driver device of this `type` (e.g. `mig`, `vfio`).
    GpuPart(String),
    /// A device of NVIDIA's ComputeDomain driver (an IMEX channel or the daemon).
    ComputeDomain,
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::GpuPart(kind) if kind == "mig" => f.write_str("MIG devices"),
            Partition::GpuPart(kind) => write!(f, "GPU devices of type {kind:?}"),
            Partition::ComputeDomain => f.write_str("ComputeDomain devices (IMEX channels)"),
        }
    }
}

/// Everything DRA that one admission decision reads.
///
/// Pools follow kube-scheduler's structured allocator (`pools_stable.go`, `GatherPools`,
/// `addSlice`, `checkSlicesInPool`): per `(driver, pool)` only the slices of the newest
/// `pool.generation` count; when that generation has fewer (or more) slices than
/// `resourceSliceCount`, the pool is incomplete (being updated) and the allocator allocates
/// nothing from it, so muster offers none of its devices (they still count in
/// [`Inventory::node_gpus`]); a pool with a device name twice is invalid, likewise.
#[derive(Debug)]
pub struct Inventory {
    gpu_driver: String,
    entries: Vec<Entry>,
    by_id: HashMap<DeviceId, usize>,
    /// node -> GPU index -> entry.
    gpus: HashMap<String, BTreeMap<usize, usize>>,
    /// Nodes with GPU-driver devices local to them.
    dra_nodes: HashSet<String>,
    holders: HashMap<DeviceId, ClaimKey>,
    /// Devices allocated to more than one claim (two allocators raced), with every claim.
    contested: HashMap<DeviceId, Vec<ClaimKey>>,
    classes: HashMap<String, (Vec<DeviceSelector>, Vec<DeviceClassConfiguration>)>,
    problems: Vec<DraProblem>,
    cache: SelectorCache,
    /// Per compiled selector (by address; the cache keeps it alive): its result on each entry,
    /// so one selector runs once per device per inventory.
    matches: Mutex<HashMap<usize, Results>>,
    /// Per entry: usable and not held by any claim (fixed once the claims are read).
    free: Vec<bool>,
}

/// One selector's result per entry, evaluated when first asked.
type Results = Arc<[OnceLock<Result<bool, String>>]>;

fn problem(object: impl Into<String>, why: impl Into<String>) -> DraProblem {
    DraProblem { object: object.into(), why: why.into() }
}

/// Why the allocator would never hand out this device to a request like muster's.
fn blocked(device: &Device) -> Option<String> {
    if let Some(t) = device.taints.iter().flatten().find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute") {
        return Some(format!("tainted {}={} with effect {}", t.key, t.value.as_deref().unwrap_or(""), t.effect));
    }
    if device.binding_conditions.as_ref().is_some_and(|b| !b.is_empty()) {
        return Some("has bindingConditions".to_string());
    }
    if device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("consumes shared counters (partitionable device)".to_string());
    }
    None
}

/// A slice's or device's reach; Err when it has none or its selector cannot be parsed.
fn reach_of(
    node_name: Option<&String>,
    all_nodes: Option<bool>,
    selector: Option<&K8sNodeSelector>,
) -> Result<(Reach, Option<K8sNodeSelector>), String> {
    if let Some(n) = node_name.filter(|n| !n.is_empty()) {
        return Ok((Reach::Node(n.clone()), None));
    }
    if all_nodes == Some(true) {
        return Ok((Reach::AllNodes, None));
    }
    if let Some(s) = selector {
        let terms = terms_from_k8s(s).map_err(|e| format!("nodeSelector: {e}"))?;
        return Ok((Reach::Selector(terms), Some(s.clone())));
    }
    Err("none of nodeName, nodeSelector, allNodes is set".to_string())
}

impl Inventory {
    /// Builds the inventory. `gpu_driver`: the driver whose devices are GPUs
    /// ([`super::NVIDIA_GPU_DRIVER`] by default). `uuid_index`: per node, GPU uuid -> GPU index
    /// from muster's node topology annotation. A GPU is a device of the GPU driver local to one
    /// node whose `type` attribute is absent or `gpu` (MIG and other partitions are not GPUs);
    /// its index is the annotation's index for its `uuid` attribute, else its `index` int
    /// attribute, else none: such a device is a problem and not offered.
    pub fn new(
        slices: &[ResourceSlice],
        classes: &[DeviceClass],
        claims: &[ResourceClaim],
        gpu_driver: &str,
        uuid_index: &HashMap<String, HashMap<String, usize>>,
    ) -> Self {
        let mut inv = Inventory {
            gpu_driver: gpu_driver.to_string(),
            entries: Vec::new(),
            by_id: HashMap::new(),
            gpus: HashMap::new(),
            dra_nodes: HashSet::new(),
            holders: HashMap::new(),
            contested: HashMap::new(),
            classes: HashMap::new(),
            problems: Vec::new(),
            cache: SelectorCache::default(),
            matches: Mutex::new(HashMap::new()),
            free: Vec::new(),
        };
        inv.add_slices(slices, uuid_index);
        for class in classes {
            let Some(name) = class.metadata.name.clone() else {
                inv.problems.push(problem("DeviceClass (unnamed)", "metadata.name is not set"));
                continue;
            };
            let spec = class.spec.as_ref();
            inv.classes.insert(
                name,
                (
                    spec.and_then(|s| s.selectors.clone()).unwrap_or_default(),
                    spec.and_then(|s| s.config.clone()).unwrap_or_default(),
                ),
            );
        }
        inv.add_claims(claims);
        inv.free = inv.entries.iter().map(|e| e.blocked.is_none() && !inv.holders.contains_key(&e.id)).collect();
        inv
    }

    fn add_slices(&mut self, slices: &[ResourceSlice], uuid_index: &HashMap<String, HashMap<String, usize>>) {
        // (driver, pool) -> (newest generation, its slices).
        let mut pools: BTreeMap<(String, String), (i64, Vec<&ResourceSlice>)> = BTreeMap::new();
        for slice in slices {
            let spec = &slice.spec;
            let key = (spec.driver.clone(), spec.pool.name.clone());
            let pool = pools.entry(key).or_insert((spec.pool.generation, Vec::new()));
            if spec.pool.generation > pool.0 {
                *pool = (spec.pool.generation, Vec::new());
            }
            if spec.pool.generation == pool.0 {
                pool.1.push(slice);
            }
        }
        for ((driver, pool_name), (_, pool_slices)) in pools {
            let pool_label = format!("pool {driver}/{pool_name}");
            let expected = pool_slices.first().map(|s| s.spec.pool.resource_slice_count).unwrap_or(0);
            let mut pool_blocked = None;
            if i64::try_from(pool_slices.len()).ok() != Some(expected) {
                let why = format!(
                    "incomplete: {} of {expected} slices of the newest generation are published; none of its devices are offered",
                    pool_slices.len()
                );
                self.problems.push(problem(pool_label.clone(), why.clone()));
                pool_blocked = Some(why);
            }
            let mut names = HashSet::new();
            let duplicate = pool_slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| !names.insert(d.name.as_str()));
            if let Some(d) = duplicate {
                let why = format!("invalid: device name {} appears twice; none of its devices are offered", d.name);
                self.problems.push(problem(pool_label.clone(), why.clone()));
                pool_blocked = Some(why);
            }
            for slice in pool_slices {
                self.add_slice(slice, pool_blocked.as_deref(), uuid_index);
            }
        }
    }

    fn add_slice(
        &mut self,
        slice: &ResourceSlice,
        pool_blocked: Option<&str>,
        uuid_index: &HashMap<String, HashMap<String, usize>>,
    ) {
        let spec = &slice.spec;
        let slice_label = format!("ResourceSlice {}", slice.metadata.name.as_deref().unwrap_or("(unnamed)"));
        let per_device = spec.per_device_node_selection == Some(true);
        let slice_reach = if per_device {
            None
        } else {
            match reach_of(spec.node_name.as_ref(), spec.all_nodes, spec.node_selector.as_ref()) {
                Ok(r) => Some(r),
                Err(why) => {
                    self.problems.push(problem(slice_label, why));
                    return;
                }
            }
        };
        for device in spec.devices.iter().flatten() {
            let device_label = format!("{slice_label} device {}", device.name);
            let (reach, selector) = match &slice_reach {
                Some(r) => r.clone(),
                None => match reach_of(device.node_name.as_ref(), device.all_nodes, device.node_selector.as_ref()) {
                    Ok(r) => r,
                    Err(why) => {
                        self.problems.push(problem(device_label, why));
                        continue;
                    }
                },
            };
            let id =
                DeviceId { driver: spec.driver.clone(), pool: spec.pool.name.clone(), device: device.name.clone() };
            if self.by_id.contains_key(&id) {
                // Only possible across pools of the same name in different generations, which
                // are already filtered; keep the first.
                continue;
            }
            let cel = CelDevice::new(&spec.driver, device);
            if let Err(why) = &cel {
                self.problems.push(problem(device_label.clone(), why.clone()));
            }
            let blocked = pool_blocked.map(str::to_string).or_else(|| blocked(device));
            let gpu = match &reach {
                Reach::Node(node) if spec.driver == self.gpu_driver => {
                    self.dra_nodes.insert(node.clone());
                    self.join_gpu_index(device, node, uuid_index, &device_label).map(|i| (node.clone(), i))
                }
                _ => None,
            };
            let partition = if spec.driver == self.gpu_driver && !is_whole_gpu(device, &self.gpu_driver) {
                let kind = attribute(device, &self.gpu_driver, "type").and_then(|a| a.string.clone());
                Some(Partition::GpuPart(kind.unwrap_or_default()))
            } else if spec.driver == super::nvidia::COMPUTE_DOMAIN_DRIVER {
                Some(Partition::ComputeDomain)
            } else {
                None
            };
            let at = self.entries.len();
            if let Some((node, index)) = &gpu {
                let on_node = self.gpus.entry(node.clone()).or_default();
                if let Some(other) = on_node.get(index) {
                    let other = &self.entries[*other].id;
                    self.problems
                        .push(problem(device_label, format!("GPU index {index} is also {other}; not offered")));
                    continue;
                }
                on_node.insert(*index, at);
            }
            self.by_id.insert(id.clone(), at);
            self.entries.push(Entry { id, reach, selector, cel, blocked, gpu, partition });
        }
    }

    /// The GPU index of a GPU-driver device on `node`, or None (with a problem when it is a GPU).
    fn join_gpu_index(
        &mut self,
        device: &Device,
        node: &str,
        uuid_index: &HashMap<String, HashMap<String, usize>>,
        label: &str,
    ) -> Option<usize> {
        let driver = self.gpu_driver.clone();
        if !is_whole_gpu(device, &driver) {
            return None;
        }
        let uuid = attribute(device, &driver, "uuid").and_then(|a| a.string.as_deref());
        let by_uuid = uuid.and_then(|u| uuid_index.get(node).and_then(|m| m.get(u)).copied());
        let index = by_uuid.or_else(|| device_slot(device, &driver));
        match index {
            Some(i) if i < MAX_GPUS => Some(i),
            Some(i) => {
                self.problems.push(problem(label, format!("GPU index {i} is not below {MAX_GPUS}; not offered")));
                None
            }
            None => {
                self.problems.push(problem(
                    label,
                    format!(
                        "GPU has neither a uuid in node {node}'s topology model ({}) nor an `index`/`minor` attribute nor a `gpu-<minor>` name; not offered",
                        uuid.unwrap_or("no uuid attribute")
                    ),
                ));
                None
            }
        }
    }

    fn add_claims(&mut self, claims: &[ResourceClaim]) {
        for claim in claims {
            let key = ClaimKey {
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                name: claim.metadata.name.clone().unwrap_or_default(),
            };
            let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
                continue;
            };
            for result in allocation.devices.iter().flat_map(|d| d.results.iter().flatten()) {
                // Admin access does not make a device unavailable to others (allocatedstate.go).
                if result.admin_access == Some(true) {
                    continue;
                }
                let id = DeviceId {
                    driver: result.driver.clone(),
                    pool: result.pool.clone(),
                    device: result.device.clone(),
                };
                match self.holders.get(&id) {
                    Some(other) if other != &key => {
                        self.problems.push(problem(
                            format!("ResourceClaim {key}"),
                            format!("device {id} is also allocated to ResourceClaim {other}"),
                        ));
                        let all = self.contested.entry(id.clone()).or_insert_with(|| vec![other.clone()]);
                        if !all.contains(&key) {
                            all.push(key.clone());
                        }
                    }
                    Some(_) => {}
                    None => {
                        self.holders.insert(id, key.clone());
                    }
                }
            }
        }
    }

    /// The claims other than `claim` a device is also allocated to (two allocators raced:
    /// kube-scheduler and muster each wrote an allocation naming it), in the order read.
    pub fn rivals<'a>(&'a self, id: &DeviceId, claim: &'a ClaimKey) -> impl Iterator<Item = &'a ClaimKey> + 'a {
        self.contested.get(id).into_iter().flatten().filter(move |c| *c != claim)
    }

    /// Whether some device is allocated to more than one claim.
    pub fn any_contested(&self) -> bool {
        !self.contested.is_empty()
    }

    /// What muster never allocates that `req` asks for: the first device its selectors match
    /// that is a part of a GPU (MIG) or a ComputeDomain device (a runtime error on a device
    /// counts as no match).
    pub fn partition_asked(&self, req: &DeviceRequestSet) -> Option<&Partition> {
        let results = self.results(req);
        self.entries.iter().enumerate().find_map(|(at, e)| {
            let p = e.partition.as_ref()?;
            matches!(self.device_matches(req, &results, at), Ok(true)).then_some(p)
        })
    }

    /// Each bad slice, device, pool or claim and why.
    pub fn problems(&self) -> &[DraProblem] {
        &self.problems
    }

    /// Whether the node has GPU-driver devices local to it (a DRA node).
    pub fn has_slices(&self, node: &str) -> bool {
        self.dra_nodes.contains(node)
    }

    /// GPU indices of the GPU driver's devices local to `node` (usable or not).
    pub fn node_gpus(&self, node: &str) -> GpuSet {
        self.gpus.get(node).and_then(|m| GpuSet::from_indices(m.keys().copied())).unwrap_or_default()
    }

    /// Of [`Inventory::node_gpus`], those held by some allocated claim.
    pub fn allocated_gpus(&self, node: &str) -> GpuSet {
        let held =
            self.gpus.get(node).into_iter().flatten().filter(|(_, e)| self.holders.contains_key(&self.entries[**e].id));
        GpuSet::from_indices(held.map(|(i, _)| *i)).unwrap_or_default()
    }

    /// The device of GPU `index` on `node`.
    pub fn gpu_device(&self, node: &str, index: usize) -> Option<&DeviceId> {
        self.gpus.get(node)?.get(&index).map(|e| &self.entries[*e].id)
    }

    /// The node and GPU index of a GPU device.
    pub fn gpu_index(&self, id: &DeviceId) -> Option<(String, usize)> {
        self.by_id.get(id).and_then(|e| self.entries[*e].gpu.clone())
    }

    /// The claim a device is allocated to.
    pub fn holder(&self, id: &DeviceId) -> Option<&ClaimKey> {
        self.holders.get(id)
    }

    /// Where a device can be used from.
    pub fn reach(&self, id: &DeviceId) -> Option<&Reach> {
        self.by_id.get(id).map(|e| &self.entries[*e].reach)
    }

    /// Parses and checks a claim spec (of a ResourceClaim or a ResourceClaimTemplate) against
    /// the supported subset and compiles the class's and the request's selectors (compiled
    /// programs are cached by expression text for the inventory's life).
    pub fn request_of(&self, spec: &ResourceClaimSpec) -> Result<DeviceRequestSet, ClaimError> {
        parse_spec(spec, &self.cache, |name| self.classes.get(name).map(|(s, c)| (s.as_slice(), c.as_slice())))
    }

    /// Each selector's results table of `req`, in order (one lock for a whole scan of devices).
    fn results(&self, req: &DeviceRequestSet) -> Vec<Results> {
        let mut tables = self.lock_matches();
        req.selectors
            .iter()
            .map(|s| {
                let key = Arc::as_ptr(&s.selector) as usize;
                tables.entry(key).or_insert_with(|| self.entries.iter().map(|_| OnceLock::new()).collect()).clone()
            })
            .collect()
    }

    /// Whether every selector of `req` matches the device, in order (class first); the first
    /// false stops, a runtime error is an error (as `selectorsMatch` in `allocator_stable.go`).
    /// `results` is [`Inventory::results`] of `req`.
    fn device_matches(&self, req: &DeviceRequestSet, results: &[Results], at: usize) -> Result<bool, ClaimError> {
        let entry = &self.entries[at];
        for (s, table) in req.selectors.iter().zip(results) {
            let evaluate = || match &entry.cel {
                Ok(device) => device.matches(&s.selector),
                Err(why) => Err(why.clone()),
            };
            let uncached;
            let result = match table.get(at) {
                Some(slot) => slot.get_or_init(evaluate),
                None => {
                    uncached = evaluate();
                    &uncached
                }
            };
            match result {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(why) => {
                    return Err(ClaimError::Runtime {
                        field: s.field.clone(),
                        expression: s.expression.clone(),
                        device: entry.id.to_string(),
                        why: why.clone(),
                    });
                }
            }
        }
        Ok(true)
    }

    fn lock_matches(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Results>> {
        match self.matches.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether the device may be handed out now: usable and not held.
    fn free(&self, at: usize) -> bool {
        self.free.get(at).copied().unwrap_or(false)
    }

    /// Whether the request is for GPU-driver GPUs. Rule: its selectors match at least one GPU
    /// of the GPU driver (allocated or not; a runtime error counts as no match). When the
    /// inventory has no GPUs at all (no DRA node yet), it is one when its class is named after
    /// the GPU driver or a selector names the driver in quotes. kube-scheduler agrees either
    /// way: muster allocates such claims only from devices the selectors match.
    pub fn is_gpu_request(&self, req: &DeviceRequestSet) -> bool {
        let mut any_gpu = false;
        let results = self.results(req);
        for (at, e) in self.entries.iter().enumerate() {
            if e.gpu.is_some() {
                any_gpu = true;
                if matches!(self.device_matches(req, &results, at), Ok(true)) {
                    return true;
                }
            }
        }
        if any_gpu {
            return false;
        }
        let quoted = [format!("'{}'", self.gpu_driver), format!("\"{}\"", self.gpu_driver)];
        req.class == self.gpu_driver || req.selector_texts().any(|t| quoted.iter().any(|q| t.contains(q.as_str())))
    }

    /// GPU indices on `node` whose devices match the class and request selectors, are not
    /// allocated and are usable (no NoSchedule/NoExecute taint, no bindingConditions, no
    /// consumesCounters, complete and valid pool). Err on a selector runtime error on any GPU
    /// of the node: kube-scheduler's allocator fails the claim then, so muster offers nothing.
    pub fn offer(&self, req: &DeviceRequestSet, node: &str) -> Result<GpuSet, ClaimError> {
        let Some(gpus) = self.gpus.get(node) else { return Ok(GpuSet::EMPTY) };
        let results = self.results(req);
        let mut offered = GpuSet::EMPTY;
        for (index, at) in gpus {
            if self.free(*at) && self.device_matches(req, &results, *at)? {
                offered = offered.with(*index).unwrap_or(offered);
            }
        }
        Ok(offered)
    }

    /// [`Inventory::offer`], with a runtime error offering nothing.
    pub fn offered_gpus(&self, req: &DeviceRequestSet, node: &str) -> GpuSet {
        self.offer(req, node).unwrap_or_default()
    }

    /// The allocation kube-scheduler would write for these GPU indices on `node`: results in
    /// request order (the first `count` indices ascending to request 0, ...), nodeSelector
    /// `matchFields metadata.name In [node]` (the allocator's for a node-local slice), configs
    /// copied FromClass then FromClaim as the allocator does. `allocationTimestamp` is left
    /// unset (kube-scheduler sets it only for binding conditions). Err when `gpus` is not
    /// `req.total()` indices or some index has no matching free device.
    pub fn gpu_allocation(
        &self,
        req: &DeviceRequestSet,
        node: &str,
        gpus: GpuSet,
    ) -> Result<AllocationResult, ClaimError> {
        let fail = |why: String| ClaimError::Allocation { node: node.to_string(), why };
        if gpus.len() as u64 != u64::from(req.total()) {
            return Err(fail(format!("{} GPUs chosen for a claim of {} devices", gpus.len(), req.total())));
        }
        let offered = self.offer(req, node)?;
        let mut devices = Vec::new();
        for index in gpus {
            if !offered.contains(index) {
                return Err(fail(format!("GPU {index} has no free device matching the claim")));
            }
            match self.gpu_device(node, index) {
                Some(id) => devices.push(id.clone()),
                None => return Err(fail(format!("GPU {index} has no device"))),
            }
        }
        Ok(self.allocation(req, &devices, Some(node_name_selector(node))))
    }

    /// For a claim shared by many pods (any driver): chooses `req.total()` free matching
    /// devices, skipping `taken`, preferring the widest reach (every device AllNodes, then
    /// AllNodes plus devices of one node selector, then plus devices of one node; groups in
    /// order of their first DeviceId, devices by DeviceId), with the reach all of them share,
    /// or None. Devices of different selectors or nodes are never mixed: without node labels
    /// muster cannot tell that their intersection is not empty.
    pub fn choose_shared(
        &self,
        req: &DeviceRequestSet,
        taken: &HashSet<DeviceId>,
    ) -> Option<(Vec<DeviceId>, SharedReach)> {
        self.choose_shared_checked(req, taken).ok().flatten()
    }

    /// [`Inventory::choose_shared`], with a selector runtime error as Err.
    pub fn choose_shared_checked(
        &self,
        req: &DeviceRequestSet,
        taken: &HashSet<DeviceId>,
    ) -> Result<Option<(Vec<DeviceId>, SharedReach)>, ClaimError> {
        let want = usize::try_from(req.total()).unwrap_or(usize::MAX);
        let mut candidates = Vec::new();
        let results = self.results(req);
        for (at, e) in self.entries.iter().enumerate() {
            if self.free(at)
                && e.partition.is_none()
                && !taken.contains(&e.id)
                && self.device_matches(req, &results, at)?
            {
                candidates.push(at);
            }
        }
        candidates.sort_by(|a, b| {
            let (a, b) = (&self.entries[*a], &self.entries[*b]);
            (a.reach.rank(), &a.id).cmp(&(b.reach.rank(), &b.id))
        });
        let all: Vec<usize> =
            candidates.iter().copied().filter(|c| self.entries[*c].reach == Reach::AllNodes).collect();
        let ids = |ats: &[usize]| ats.iter().map(|a| self.entries[*a].id.clone()).collect::<Vec<_>>();
        if all.len() >= want {
            return Ok(Some((ids(&all[..want]), SharedReach::everywhere())));
        }
        // Groups of one selector or one node, in candidate order (widest, then by DeviceId).
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for c in candidates.iter().copied().filter(|c| self.entries[*c].reach != Reach::AllNodes) {
            let reach = &self.entries[c].reach;
            match groups.iter_mut().find(|g| &self.entries[g[0]].reach == reach) {
                Some(g) => g.push(c),
                None => groups.push(vec![c]),
            }
        }
        for group in groups {
            if all.len() + group.len() < want {
                continue;
            }
            let first = &self.entries[group[0]];
            let reach = match (&first.reach, &first.selector) {
                (Reach::Node(n), _) => SharedReach::node(n),
                (_, Some(s)) => match SharedReach::of_selector(s) {
                    Ok(r) => r,
                    Err(_) => continue,
                },
                _ => continue,
            };
            let mut chosen = all.clone();
            chosen.extend(group.iter().copied().take(want - all.len()));
            return Ok(Some((ids(&chosen), reach)));
        }
        Ok(None)
    }

    /// The allocation for devices chosen by [`Inventory::choose_shared`]: results in request
    /// order, nodeSelector from the reach (none for everywhere), configs as the allocator copies
    /// them.
    pub fn shared_allocation(
        &self,
        req: &DeviceRequestSet,
        devices: &[DeviceId],
        reach: &SharedReach,
    ) -> AllocationResult {
        self.allocation(req, devices, reach.node_selector().cloned())
    }

    fn allocation(
        &self,
        req: &DeviceRequestSet,
        devices: &[DeviceId],
        node_selector: Option<K8sNodeSelector>,
    ) -> AllocationResult {
        let names = req.requests.iter().flat_map(|(name, count)| std::iter::repeat_n(name, *count as usize));
        let results = devices
            .iter()
            .zip(names)
            .map(|(id, request)| DeviceRequestAllocationResult {
                request: request.clone(),
                driver: id.driver.clone(),
                pool: id.pool.clone(),
                device: id.device.clone(),
                ..Default::default()
            })
            .collect();
        let config = config_of(req);
        AllocationResult {
            allocation_timestamp: None,
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: (!config.is_empty()).then_some(config),
            }),
            node_selector,
        }
    }
}

/// The configs the allocator copies into an allocation (`Allocate` in `allocator_stable.go`):
/// each class config once (for every request of the class, which here is all of them, so
/// `requests` is cleared), then each claim config that applies to all requests or names one
/// of them; a config naming every request has `requests` cleared ("empty means all").
fn config_of(req: &DeviceRequestSet) -> Vec<DeviceAllocationConfiguration> {
    let all_names: Vec<&String> = req.requests.iter().map(|(n, _)| n).collect();
    let mut out: Vec<DeviceAllocationConfiguration> = req
        .class_config
        .iter()
        .map(|c| DeviceAllocationConfiguration {
            source: CONFIG_SOURCE_CLASS.to_string(),
            requests: None,
            opaque: c.opaque.clone(),
        })
        .collect();
    for c in &req.claim_config {
        let named = c.requests.as_deref().unwrap_or_default();
        if !named.is_empty() && !all_names.iter().any(|n| named.contains(n)) {
            continue;
        }
        let covers_all = all_names.iter().all(|n| named.contains(n));
        out.push(DeviceAllocationConfiguration {
            source: CONFIG_SOURCE_CLAIM.to_string(),
            requests: (!named.is_empty() && !covers_all).then(|| named.to_vec()),
            opaque: c.opaque.clone(),
        });
    }
    out
}
