/* nfc: Unicode normalization form C (canonical decomposition, canonical ordering, canonical
 * composition; UAX #15) of UTF-8 text, as Hugging Face's NFC normalizer applies it before
 * tokenizing. The Unicode data is a table generated once (nfc_table.h, from
 * tests/reference/make_nfc_table.py); bytes that are not valid UTF-8 pass through unchanged and
 * block composition across them. */
#ifndef GREENLM_NFC_H
#define GREENLM_NFC_H

#include <stddef.h>

/* 1 when NFC leaves the len bytes of text as they are by a quick test (every code point below
 * U+0300, where nothing decomposes or combines: ASCII and Latin-1 text); 0 means "maybe". */
int nfc_quick(const char *text, size_t len);
/* The NFC form of len bytes of text: a malloc'd buffer (free() it) of *out_len bytes. */
char *nfc_normalize(const char *text, size_t len, size_t *out_len);

#endif
