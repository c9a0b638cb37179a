//! Stream capture: the launches queued on the device's stream between
//! [`Device::begin_capture`] and [`Device::end_capture`] are recorded (not run) into one
//! CUDA graph, which [`Graph::launch`] then replays with a single call. Kernels of a replayed
//! graph see the same arguments every time; anything that changes between replays (the token
//! id, the position) must be read from device memory.

use crate::device::Device;
use crate::error::CudaError;
use crate::raw::SendGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

/// A captured and instantiated sequence of launches.
pub struct Graph(SendGraph);

impl Graph {
    /// Queues one replay of the whole graph on the device's stream.
    pub fn launch(&self) -> Result<(), CudaError> {
        self.0
             .0
            .launch()
            .map_err(CudaError::driver("cuGraphLaunch"))
    }
}

impl Device {
    /// Starts recording this thread's launches on the stream instead of running them.
    /// Thread-local mode: an allocation or a host copy during capture fails (with the error
    /// of that call) instead of silently breaking the graph.
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        self.stream()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("cuStreamBeginCapture"))
    }

    /// Stops recording and instantiates what was recorded (`None`: nothing was), after
    /// joining the side and branch streams' work if any is open.
    pub fn end_capture(&self) -> Result<Option<Graph>, CudaError> {
        self.join_side()?;
        self.join_branch()?;
        let graph = self
            .stream()
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("cuStreamEndCapture"))?;
        Ok(graph.map(|g| Graph(SendGraph(g))))
    }
}
