//! GPT-2's reversible byte <-> unicode mapping used by byte-level BPE token strings.
//!
//! Printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) map to the char of the same code
//! point; the other 68 bytes (controls, space, DEL, NBSP, soft hyphen...) map, in byte order, to
//! U+0100, U+0101, ... so that no token string contains whitespace or control characters.

/// Every mapped char is below this code point.
const CODE_LIMIT: usize = 0x144;

/// The byte <-> char tables of the GPT-2 mapping.
#[derive(Debug, Clone)]
pub struct ByteLevel {
    /// The char each byte value is written as.
    byte_to_char: [char; 256],
    /// The byte each mapped code point stands for (`None` for unmapped code points).
    char_to_byte: [Option<u8>; CODE_LIMIT],
}

impl ByteLevel {
    pub fn new() -> Self {
        let mut byte_to_char = ['\0'; 256];
        let mut char_to_byte = [None; CODE_LIMIT];
        let mut next_shifted = 256usize;
        for byte in 0..=255u8 {
            let printable = matches!(byte, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
            let code = if printable {
                usize::from(byte)
            } else {
                next_shifted += 1;
                next_shifted - 1
            };
            // Codes stay below CODE_LIMIT (256 + 68), far from the surrogate range.
            let c = u32::try_from(code)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            byte_to_char[usize::from(byte)] = c;
            if let Some(slot) = char_to_byte.get_mut(code) {
                *slot = Some(byte);
            }
        }
        Self {
            byte_to_char,
            char_to_byte,
        }
    }

    /// The char `byte` is written as.
    pub fn char_of(&self, byte: u8) -> char {
        self.byte_to_char[usize::from(byte)]
    }

    /// A token's bytes written as a GPT-2 token string.
    pub fn encode(&self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.char_of(b)).collect()
    }

    /// The bytes a GPT-2 token string stands for, or `None` if it holds an unmapped char.
    pub fn decode(&self, text: &str) -> Option<Vec<u8>> {
        text.chars()
            .map(|c| self.char_to_byte.get(c as usize).copied().flatten())
            .collect()
    }
}

impl Default for ByteLevel {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection_with_known_points() {
        let bl = ByteLevel::new();
        assert_eq!(bl.char_of(b' '), 'Ġ');
        assert_eq!(bl.char_of(b'\n'), 'Ċ');
        assert_eq!(bl.char_of(b'!'), '!');
        assert_eq!(bl.char_of(0), '\u{100}');
        assert_eq!(bl.char_of(0xad), '\u{143}');
        let mut chars: Vec<char> = (0..=255u8).map(|b| bl.char_of(b)).collect();
        chars.sort_unstable();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(bl.decode(&bl.encode(&all)), Some(all));
        assert_eq!(bl.decode("a b"), None);
        assert_eq!(bl.decode("\u{144}"), None);
    }
}
