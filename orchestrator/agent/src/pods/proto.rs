//! The messages of the kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`,
//! service `v1.PodResourcesLister`) that the agent reads, written by hand for `prost`
//! (no protoc). Only the fields the agent needs are declared; the others (`cpu_ids`,
//! `memory`, `dynamic_resources`, `topology`, ...) are skipped on decoding, as protobuf
//! skips every field it does not know, so a newer kubelet's answer still decodes.
//!
//! Field numbers, as in the kubelet's `api.proto`:
//!
//! ```text
//! message ListPodResourcesRequest {}
//! message ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
//! message PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
//! message ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
//! message ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }
//! ```

/// `v1.PodResourcesLister/List` takes no argument.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// Every pod the kubelet runs, with the resources its containers were given.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// The devices of one device-plugin resource (`nvidia.com/gpu`) given to a container:
/// for NVIDIA's plugin, GPU UUIDs (`GPU-8d5e...`) or MIG device UUIDs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}
