//! Kernel launches through `cuLaunchKernelEx`, so that a launch may carry programmatic
//! dependent launch (PDL, sm_90 and later): the next kernel on the stream is scheduled while
//! the previous one still runs, does what needs nothing from it (load its weights, a DeltaNet
//! layer's state) and then waits in `griddepcontrol.wait` (`common.cuh`'s `pdl_begin`) until
//! that kernel has finished and its writes are visible. Every kernel of the crate calls
//! `pdl_begin` before it reads another kernel's output or writes anything, so a launch with
//! the attribute is safe for all of them. cudarc's `LaunchArgs` cannot pass launch
//! attributes, hence this builder; its arguments are pushed as with `LaunchArgs`.
//!
//! On by default (H200: tg128 +7.8 %, the same bits); `REDLITE_PDL=0` makes every launch a
//! plain one and compiles the kernels without their wait.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PushKernelArg,
};

/// More arguments than any kernel of the crate takes.
const MAX_ARGS: usize = 40;

/// Whether the opened device has PDL (compute capability 9.0 or later).
static DEVICE_HAS_PDL: AtomicBool = AtomicBool::new(false);

/// Records the opened device's compute capability major version.
pub(crate) fn set_device_major(major: i32) {
    DEVICE_HAS_PDL.store(major >= 9, Ordering::Relaxed);
}

/// Whether PDL is asked for (the default; `REDLITE_PDL=0` turns it off): the kernels are then
/// compiled with their wait (`compile.rs`) and, on a device that has it, launched with the
/// attribute.
pub fn pdl_requested() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_PDL").as_deref() != Ok("0"))
}

/// Whether launches carry the PDL attribute: requested and the device has it (sm_90+).
pub fn pdl_enabled() -> bool {
    pdl_requested() && DEVICE_HAS_PDL.load(Ordering::Relaxed)
}

thread_local! {
    /// Whether this thread's launches may take PDL: see [`overlap_launches`].
    static OVERLAP: Cell<bool> = const { Cell::new(true) };
}

/// Whether this thread's next launches carry the PDL attribute (where [`pdl_enabled`]). The
/// backend turns it off for a prompt's batch: there the next kernel's early CTAs sit on the
/// multiprocessors, waiting, while the current one still has waves of CTAs to place (H200,
/// full IQ2_XXS file: pp512 5,367 t/s with PDL against 5,878 without). Either way is
/// correct: a kernel launched without the attribute waits in `griddepcontrol.wait` for
/// nothing, the previous kernel having finished before it starts.
pub fn overlap_launches(on: bool) {
    OVERLAP.with(|o| o.set(on));
}

fn pdl_for_this_launch() -> bool {
    pdl_enabled() && OVERLAP.with(Cell::get)
}

/// One kernel launch being built: arguments in the kernel's order, then [`Launch::launch`].
/// Fixed arrays, no allocation per launch.
pub(crate) struct Launch<'a> {
    stream: &'a CudaStream,
    kernel: &'a CudaFunction,
    /// Slot i's scalar, borrowed for 'a; null where slot i is a buffer, whose device address
    /// is `addresses[i]` (the parameter array points into it at launch time, `&mut self`
    /// keeping it in place).
    values: [*const c_void; MAX_ARGS],
    addresses: [u64; MAX_ARGS],
    /// Arguments pushed (past MAX_ARGS: refused at launch).
    count: usize,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(stream: &'a CudaStream, kernel: &'a CudaFunction) -> Self {
        Launch {
            stream,
            kernel,
            values: [std::ptr::null(); MAX_ARGS],
            addresses: [0; MAX_ARGS],
            count: 0,
        }
    }

    fn push(&mut self, value: *const c_void, address: u64) -> &mut Self {
        if self.count < MAX_ARGS {
            self.values[self.count] = value;
            self.addresses[self.count] = address;
        }
        self.count += 1;
        self
    }

    fn push_address(&mut self, address: u64) -> &mut Self {
        self.push(std::ptr::null(), address)
    }

    /// Launches the kernel with the pushed arguments. Returns no events (the signature is
    /// `LaunchArgs::launch`'s, so callers treat both alike).
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and the
    /// grid must only touch memory the buffers hold (cudarc's `LaunchArgs::launch` contract).
    /// The kernel must call `pdl_begin()` before it reads another kernel's output or writes
    /// global memory, as every kernel of the crate does.
    pub(crate) unsafe fn launch(
        &mut self,
        cfg: LaunchConfig,
    ) -> Result<Option<(CudaEvent, CudaEvent)>, DriverError> {
        if self.count > MAX_ARGS {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        self.stream.context().bind_to_thread()?;
        let mut pointers = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (i, pointer) in pointers.iter_mut().enumerate().take(self.count) {
            *pointer = match self.values[i].is_null() {
                true => (&self.addresses[i]) as *const u64 as *mut c_void,
                false => self.values[i] as *mut c_void,
            };
        }
        let mut attribute = CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(pdl_for_this_launch()),
        };
        // SAFETY: `config` and `attribute` live across the call; `pointers` holds one valid
        // pointer per kernel parameter (the caller's contract), each to a value that outlives
        // the call (`self.addresses`, or a scalar borrowed for 'a).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.kernel.cu_function(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        Ok(None)
    }
}

// SAFETY (all impls): a scalar is passed by a pointer to the caller's value, borrowed for
// the builder's lifetime; a buffer by its device address, copied into the builder. The
// crate's streams have cudarc's event tracking off (`single_stream`), so taking an address
// records nothing.
// Scalars one by one: a blanket impl over `DeviceRepr` would overlap the buffer impls below
// for the coherence rules (cudarc owns that trait and the buffer types).
macro_rules! scalar_args {
    ($($scalar:ty),*) => {$(
        unsafe impl<'a, 'b: 'a> PushKernelArg<&'b $scalar> for Launch<'a> {
            fn arg(&mut self, arg: &'b $scalar) -> &mut Self {
                self.push(arg as *const $scalar as *const c_void, 0)
            }
        }
    )*};
}
scalar_args!(i32, u32, i64, u64, f32);

unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b CudaSlice<T>> for Launch<'a> {
    fn arg(&mut self, arg: &'b CudaSlice<T>) -> &mut Self {
        let (address, _sync) = arg.device_ptr(self.stream);
        self.push_address(address)
    }
}

unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut CudaSlice<T>> for Launch<'a> {
    fn arg(&mut self, arg: &'b mut CudaSlice<T>) -> &mut Self {
        let (address, _sync) = arg.device_ptr_mut(self.stream);
        self.push_address(address)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for Launch<'a> {
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        let (address, _sync) = arg.device_ptr(self.stream);
        self.push_address(address)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for Launch<'a> {
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        let (address, _sync) = arg.device_ptr_mut(self.stream);
        self.push_address(address)
    }
}
