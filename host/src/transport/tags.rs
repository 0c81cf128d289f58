//! Connection tags the library reserves for its own connections (high numbers, to stay
//! clear of a user's), and what error messages call them ([`ConnTag`]).

/// The collectives' scratch (memory channels inside a host).
pub(crate) const TAG_SCRATCH: u32 = 0xC011_0001;
/// The collectives' semaphores.
pub(crate) const TAG_SEMAPHORES: u32 = 0xC011_0002;
/// Send/recv inside a host.
pub(crate) const TAG_P2P: u32 = 0xC011_0004;
/// The collectives' rounds across hosts.
pub(crate) const TAG_CROSS: u32 = 0xC011_0005;
/// Send/recv across hosts, from the lower to the higher rank.
pub(crate) const TAG_UP: u32 = 0xC011_0006;
/// Send/recv across hosts, from the higher to the lower rank.
pub(crate) const TAG_DOWN: u32 = 0xC011_0007;
/// Lane `l`'s proxy channels (see `mscclpp_device::collectives::proxy`): `TAG_PROXY + l`.
pub(crate) const TAG_PROXY: u32 = 0xC011_0100;
/// Most proxy lanes a tag is named for (beyond, the tag is shown as a number).
pub(crate) const TAG_PROXY_LANES: u32 = 0x100;

/// What the library uses a connection of `tag` for, if it is one of its own.
pub(crate) fn tag_name(tag: u32) -> Option<String> {
    let name = match tag {
        TAG_SCRATCH => "the collectives' scratch",
        TAG_SEMAPHORES => "the collectives' semaphores",
        TAG_P2P => "send/recv inside the host",
        TAG_CROSS => "the collectives' rounds across hosts",
        TAG_UP => "send/recv across hosts, lower to higher rank",
        TAG_DOWN => "send/recv across hosts, higher to lower rank",
        t if (TAG_PROXY..TAG_PROXY + TAG_PROXY_LANES).contains(&t) => {
            return Some(format!("the collectives' proxy lane {}", t - TAG_PROXY));
        }
        _ => return None,
    };
    Some(name.into())
}

/// A connection tag as error messages show it: the collectives' own tags by what they
/// carry (`the collectives' rounds across hosts`: their numbers are internal), a user's as
/// `tag N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTag(pub u32);

impl std::fmt::Display for ConnTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match tag_name(self.0) {
            Some(name) => f.write_str(&name),
            None => write!(f, "tag {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors name the collectives' connections by what they carry, never by their internal tag
    /// numbers (every tag of theirs has a name); a user's tag keeps its number.
    #[test]
    fn connection_tags_of_the_collectives_are_named_without_numbers() {
        let ours = [
            TAG_SCRATCH,
            TAG_SEMAPHORES,
            TAG_P2P,
            TAG_CROSS,
            TAG_UP,
            TAG_DOWN,
            TAG_PROXY,
            TAG_PROXY + 7,
        ];
        for tag in ours {
            let shown = ConnTag(tag).to_string();
            assert!(
                !shown.contains("tag")
                    && !shown.contains("0x")
                    && !shown.contains(&tag.to_string()),
                "{tag:#x}: {shown}"
            );
        }
        assert_eq!(ConnTag(7).to_string(), "tag 7");
    }
}
