//! Short lowercase names for the protocol's closed enums. These names appear in the JSON API, in config
//! selectors and as metric attribute values; the set of each is closed, so label cardinality stays bounded.

use crate::pb::{Outcome, PoolKind, PreparingPhase, PriorityClass, StepOrigin, WaitReason};

macro_rules! named_enum {
    ($ty:ty, $( $variant:ident => $name:literal ),+ $(,)?) => {
        impl Label for $ty {
            fn label(self) -> &'static str {
                match self { $( <$ty>::$variant => $name, )+ }
            }
            fn from_label(s: &str) -> Option<Self> {
                match s { $( $name => Some(<$ty>::$variant), )+ _ => None }
            }
            fn all() -> &'static [Self] {
                &[$( <$ty>::$variant, )+]
            }
        }
    };
}

/// A closed enum with a short lowercase name per variant.
pub trait Label: Sized + Copy + 'static {
    /// The variant's short name, e.g. `managed`.
    fn label(self) -> &'static str;
    /// The variant with that short name, if any.
    fn from_label(s: &str) -> Option<Self>;
    /// Every variant, `unspecified` first.
    fn all() -> &'static [Self];
}

named_enum!(PoolKind,
    Unspecified => "unspecified", Managed => "managed", Dedicated => "dedicated");
named_enum!(PriorityClass,
    Unspecified => "unspecified", Normal => "normal", Urgent => "urgent");
named_enum!(WaitReason,
    Unspecified => "unspecified", Capacity => "capacity", Priority => "priority", Quota => "quota",
    DependencyOrHold => "dependency_or_hold", Provisioning => "provisioning", ImagePull => "image_pull",
    DataStaging => "data_staging", PreemptionRecovery => "preemption_recovery",
    Misconfigured => "misconfigured", Unknown => "unknown");
named_enum!(PreparingPhase,
    Unspecified => "unspecified", Provisioning => "provisioning", ImagePull => "image_pull",
    DataStaging => "data_staging", Environment => "environment", Other => "other");
named_enum!(Outcome,
    Unspecified => "unspecified", Succeeded => "succeeded", Failed => "failed", Cancelled => "cancelled",
    TimedOut => "timed_out", Preempted => "preempted");
named_enum!(StepOrigin,
    Unspecified => "unspecified", TrainingProcess => "training_process", ContainerStart => "container_start",
    SchedulerStart => "scheduler_start");

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Label + PartialEq + std::fmt::Debug>() {
        for v in T::all() {
            assert_eq!(T::from_label(v.label()), Some(*v));
        }
        assert_eq!(T::from_label("no-such-name"), None);
    }

    #[test]
    fn every_name_round_trips() {
        round_trip::<PoolKind>();
        round_trip::<PriorityClass>();
        round_trip::<WaitReason>();
        round_trip::<PreparingPhase>();
        round_trip::<Outcome>();
        round_trip::<StepOrigin>();
    }
}
