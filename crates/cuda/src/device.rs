//! One GPU: its context and stream, its architecture, and every kernel loaded from the
//! (cached) NVRTC build of the kernel modules.

use crate::compile::compile_modules_cached;
use crate::error::CudaError;
use crate::raw;
use crate::source::modules;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut,
    DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub struct Device {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Work beside the main stream (the expert cache's prefetch): see [`Device::on_side`].
    side: SideStream,
    /// Products of a layer that need nothing of each other: see [`Device::on_branch`].
    branch: SideStream,
    /// A third lane for such products: see [`Device::on_second_branch`].
    second_branch: SideStream,
    arch: String,
    multiprocessors: u32,
    /// Most dynamic shared memory one CTA may ask for once its kernel's limit is raised.
    shared_per_block_optin: usize,
    /// Kernel name expression (e.g. `matvec_kernel<Q4K, 4, true>`) to its function.
    kernels: HashMap<String, CudaFunction>,
    /// With `REDLITE_TIMELINE=1`, every loaded module by name (their rings are read at drop).
    timeline_modules: Vec<(String, Arc<CudaModule>)>,
    /// Device memory in use when the kernels were loaded: the run's own use is counted
    /// from here.
    baseline: u64,
    /// Bytes the run may allocate (`--gpu-limit`); 0: no limit.
    limit: AtomicU64,
    /// cuBLAS on the stream, made on first use (`None`: libcublas not found).
    blas: OnceLock<Option<cudarc::cublas::CudaBlas>>,
}

impl Drop for Device {
    fn drop(&mut self) {
        if crate::profile::profiling() {
            eprint!("{}", crate::profile::report());
        }
        if !self.timeline_modules.is_empty() {
            eprint!(
                "{}",
                crate::timeline::read(&self.timeline_modules, &self.stream)
            );
        }
    }
}

impl Device {
    /// Opens GPU `ordinal`, compiles (or loads from the disk cache) every kernel module for
    /// its architecture and loads them. [`CudaError::NoDriver`], [`CudaError::NoNvrtc`] and
    /// [`CudaError::NoDevice`] mean "use the CPU".
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        if !raw::driver_present() {
            return Err(CudaError::NoDriver);
        }
        if !raw::nvrtc_present() {
            return Err(CudaError::NoNvrtc);
        }
        let count = CudaContext::device_count().map_err(CudaError::driver("cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let context = CudaContext::new(ordinal).map_err(CudaError::driver("cuCtxCreate"))?;
        let (major, minor) = context.compute_capability().map_err(CudaError::driver(
            "cuDeviceGetAttribute(compute capability)",
        ))?;
        let arch = format!("sm_{major}{minor}");
        raw::set_device_major(major);
        let multiprocessors = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(CudaError::driver("cuDeviceGetAttribute(multiprocessors)"))?;
        let shared_optin = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(CudaError::driver(
                "cuDeviceGetAttribute(shared memory per block)",
            ))?;
        // One stream of our own (the legacy default stream cannot be captured into a graph).
        let stream = raw::single_stream(&context)?;
        let side = SideStream::new(&context)?;
        let branch = SideStream::new(&context)?;
        let second_branch = SideStream::new(&context)?;
        let mut kernels = HashMap::new();
        let mut timeline_modules = Vec::new();
        let modules = modules();
        let compiled_modules = compile_modules_cached(&modules, &arch)?;
        for (source, compiled) in modules.iter().zip(compiled_modules) {
            let loaded = context
                .load_module(Ptx::from_binary(compiled.image))
                .map_err(CudaError::driver("cuModuleLoadData"))?;
            if crate::timeline::on() {
                timeline_modules.push((source.name.clone(), loaded.clone()));
            }
            for (expression, lowered) in compiled.lowered {
                let function = loaded
                    .load_function(&lowered)
                    .map_err(CudaError::driver("cuModuleGetFunction"))?;
                kernels.insert(expression, function);
            }
        }
        let (free, total) = context
            .mem_get_info()
            .map_err(CudaError::driver("cuMemGetInfo"))?;
        Ok(Device {
            stream,
            side,
            branch,
            second_branch,
            context,
            arch,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1),
            shared_per_block_optin: usize::try_from(shared_optin).unwrap_or(0),
            kernels,
            timeline_modules,
            baseline: total.saturating_sub(free) as u64,
            limit: AtomicU64::new(0),
            blas: OnceLock::new(),
        })
    }

    /// The cuBLAS handle on this device's stream, created on first use; `None` where
    /// libcublas cannot be loaded.
    pub(crate) fn blas(&self) -> Option<&cudarc::cublas::CudaBlas> {
        self.blas
            .get_or_init(|| raw::blas_handle(&self.stream))
            .as_ref()
    }

    /// Caps what this run allocates on the device at `bytes` (`--gpu-limit`: a 24 GiB card
    /// emulated on a larger one); `None` lifts the cap. Allocations past it fail with
    /// [`CudaError::OverLimit`] before they are made.
    pub fn set_limit(&self, bytes: Option<u64>) {
        self.limit.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// Device memory this run uses now (what the driver reports in use, less what was in
    /// use when the device was opened).
    pub fn used(&self) -> Result<u64, CudaError> {
        let (free, total) = self
            .context
            .mem_get_info()
            .map_err(CudaError::driver("cuMemGetInfo"))?;
        Ok((total.saturating_sub(free) as u64).saturating_sub(self.baseline))
    }

    /// Refuses an allocation of `bytes` that would pass the limit.
    fn check_room(&self, bytes: u64) -> Result<(), CudaError> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return Ok(());
        }
        let would_use = self.used()?.saturating_add(bytes);
        if would_use > limit {
            return Err(CudaError::OverLimit {
                requested: bytes,
                would_use,
                limit,
            });
        }
        Ok(())
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The architecture the kernels were built for, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Most dynamic shared memory one CTA may use after raising its kernel's limit (227 KiB
    /// on the H100 and H200, 163 KiB on the A100).
    pub(crate) fn shared_per_block_optin(&self) -> usize {
        self.shared_per_block_optin
    }

    pub fn name(&self) -> Result<String, CudaError> {
        self.context
            .name()
            .map_err(CudaError::driver("cuDeviceGetName"))
    }

    /// With `--profile` (`enable_components`): `component`'s launches start here on the
    /// stream. Nothing otherwise.
    pub fn mark(&self, component: &'static str) {
        // Side and branch work is not a component of the main stream's timeline.
        if !self.side.is_active() && !self.branch.is_active() && !self.second_branch.is_active() {
            crate::profile::mark(self.stream(), component);
        }
    }

    /// The stream the ops of this device are queued on: the main stream, the side stream
    /// inside [`Device::on_side`], or a branch stream inside [`Device::on_branch`] or
    /// [`Device::on_second_branch`].
    pub fn stream(&self) -> &Arc<CudaStream> {
        if self.side.is_active() {
            &self.side.stream
        } else if self.branch.is_active() {
            &self.branch.stream
        } else if self.second_branch.is_active() {
            &self.second_branch.stream
        } else {
            &self.stream
        }
    }

    /// Queues the launches of `work` on the side stream, after everything queued on the main
    /// stream so far, so that they run beside what the main stream does next; the main
    /// stream does not wait for them until [`Device::wait_side`] or [`Device::join_side`].
    /// Inside a capture the side stream's launches join the graph as a parallel branch.
    /// The caller keeps the buffers the side work touches away from the main stream's work
    /// until it waits.
    pub fn on_side<T, E: From<CudaError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.fork_onto(&self.side, work)
    }

    /// Queues the launches of `work` on the branch stream, after everything queued on the
    /// main stream so far, until [`Device::join_branch`]: a layer's products that read the
    /// same input and write different buffers run beside each other instead of one after the
    /// other (inside a capture, as a parallel branch of the graph). A stream of its own, so
    /// that joining it never waits for the expert cache's prefetch on the side stream.
    pub fn on_branch<T, E: From<CudaError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.fork_onto(&self.branch, work)
    }

    /// [`Device::on_branch`] on a stream of its own beside the first branch: three products
    /// that read the same input side by side.
    pub fn on_second_branch<T, E: From<CudaError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.fork_onto(&self.second_branch, work)
    }

    /// The main stream waits for all the branch streams' work (nothing when there is none).
    pub fn join_branch(&self) -> Result<(), CudaError> {
        self.join_from(&self.branch)?;
        self.join_from(&self.second_branch)
    }

    fn fork_onto<T, E: From<CudaError>>(
        &self,
        lane: &SideStream,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        lane.fork
            .record(&self.stream)
            .map_err(CudaError::driver("cuEventRecord"))?;
        lane.stream
            .wait(&lane.fork)
            .map_err(CudaError::driver("cuStreamWaitEvent"))?;
        lane.pending.store(true, Ordering::Relaxed);
        lane.active.store(this_thread(), Ordering::Relaxed);
        let result = work();
        lane.active.store(0, Ordering::Relaxed);
        result
    }

    /// Whether the launches this thread queues from now on may overlap the kernel before
    /// them (programmatic dependent launch, where the device and `REDLITE_PDL` allow it):
    /// on for batches of decode size, off for a prompt's (see `raw::overlap_launches`).
    pub fn overlap_launches(&self, on: bool) {
        raw::overlap_launches(on);
    }

    /// Marks the side stream's work queued so far, for [`Device::wait_side`].
    pub fn mark_side(&self) -> Result<(), CudaError> {
        self.side
            .mark
            .record(&self.side.stream)
            .map_err(CudaError::driver("cuEventRecord"))
    }

    /// The main stream waits for the side stream's work up to the last [`Device::mark_side`].
    pub fn wait_side(&self) -> Result<(), CudaError> {
        self.stream
            .wait(&self.side.mark)
            .map_err(CudaError::driver("cuStreamWaitEvent"))
    }

    /// The main stream waits for all the side stream's work (nothing when there is none
    /// since the last join). A capture must join before it ends.
    pub fn join_side(&self) -> Result<(), CudaError> {
        self.join_from(&self.side)
    }

    fn join_from(&self, lane: &SideStream) -> Result<(), CudaError> {
        if !lane.pending.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        lane.join
            .record(&lane.stream)
            .map_err(CudaError::driver("cuEventRecord"))?;
        self.stream
            .wait(&lane.join)
            .map_err(CudaError::driver("cuStreamWaitEvent"))
    }

    pub(crate) fn kernel(&self, expression: &str) -> Result<&CudaFunction, CudaError> {
        self.kernels
            .get(expression)
            .ok_or_else(|| CudaError::MissingKernel {
                kernel: expression.to_string(),
            })
    }

    /// Copies `data` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.check_room(std::mem::size_of_val(data) as u64)?;
        self.stream
            .clone_htod(data)
            .map_err(CudaError::driver("cuMemcpyHtoD"))
    }

    /// Copies a device buffer back, waiting for the work queued before it.
    pub fn download<T: DeviceRepr>(&self, data: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        self.stream
            .clone_dtoh(data)
            .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.check_room((len * size_of::<T>()) as u64)?;
        self.stream
            .alloc_zeros(len)
            .map_err(CudaError::driver("cuMemAlloc"))
    }

    /// Copies `src` into an existing device buffer of the same length (queued on the stream).
    pub fn copy_to_device<T: DeviceRepr>(
        &self,
        src: &[T],
        dst: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError> {
        self.stream
            .memcpy_htod(src, dst)
            .map_err(CudaError::driver("cuMemcpyHtoD"))
    }

    /// Copies a device buffer into `dst` of the same length, waiting for the work before it.
    pub fn copy_to_host<T: DeviceRepr>(
        &self,
        src: &CudaView<'_, T>,
        dst: &mut [T],
    ) -> Result<(), CudaError> {
        self.stream
            .memcpy_dtoh(src, dst)
            .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    /// Sets a device buffer to zero bits (queued on the stream).
    pub fn zero<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<(), CudaError> {
        self.stream
            .memset_zeros(dst)
            .map_err(CudaError::driver("cuMemsetD8"))
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// The device address of a buffer (alignment checks; identity of the buffers a captured
    /// graph was recorded with).
    pub fn address<T>(&self, buffer: &impl DevicePtr<T>) -> u64 {
        let (address, _sync) = buffer.device_ptr(&self.stream);
        address
    }
}

/// A stream for work beside the main one, and the events that order the two; made once (no
/// event is created during a capture).
struct SideStream {
    stream: Arc<CudaStream>,
    /// The thread ([`this_thread`]) whose launches go to the side stream, inside
    /// [`Device::on_side`]; 0: none. Other threads sharing the device keep the main stream.
    active: AtomicU64,
    /// The side stream has work the main stream has not joined.
    pending: AtomicBool,
    fork: CudaEvent,
    mark: CudaEvent,
    join: CudaEvent,
}

impl SideStream {
    /// Whether this thread is inside [`Device::on_side`].
    fn is_active(&self) -> bool {
        let active = self.active.load(Ordering::Relaxed);
        active != 0 && active == this_thread()
    }

    fn new(context: &Arc<CudaContext>) -> Result<SideStream, CudaError> {
        let event = || {
            context
                .new_event(None)
                .map_err(CudaError::driver("cuEventCreate"))
        };
        Ok(SideStream {
            stream: context
                .new_stream()
                .map_err(CudaError::driver("cuStreamCreate"))?,
            active: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            fork: event()?,
            mark: event()?,
            join: event()?,
        })
    }
}

/// A number of the calling thread, unique in the process and never 0.
fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static THIS: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    THIS.with(|t| *t)
}
