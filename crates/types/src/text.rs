//! Text cut to a size in bytes, at a character boundary, so that what is kept stays UTF-8.

/// Cuts `text` to at most `max` bytes, at the last character boundary that fits.
pub fn cut_to_bytes(text: &mut String, max: usize) {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
    }
}

#[cfg(test)]
mod tests {
    use super::cut_to_bytes;

    #[test]
    fn cuts_at_a_character_boundary() {
        let mut s = "aé".repeat(3);
        cut_to_bytes(&mut s, 4);
        assert_eq!(s, "aéa");
        let mut s = "aé".to_owned();
        cut_to_bytes(&mut s, 2);
        assert_eq!(s, "a");
        let mut s = "short".to_owned();
        cut_to_bytes(&mut s, 100);
        assert_eq!(s, "short");
    }
}
