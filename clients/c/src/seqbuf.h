/* seqbuf.h - sequence buffer (PROTOCOL 7): slot seq mod size, tagged with the full seq.
 * The caller keeps the per-entry state in its own array indexed by rc_seqbuf_index(). */
#ifndef RC_SEQBUF_H
#define RC_SEQBUF_H

#include <stdint.h>

#define RC_SEQBUF_EMPTY 0xFFFFFFFFu

typedef struct rc_seqbuf {
    uint32_t size;          /* power of two, 1..32768 */
    uint32_t *tags;
} rc_seqbuf;

void rc_seqbuf_init(rc_seqbuf *buf, uint32_t *tags, uint32_t size);
void rc_seqbuf_clear(rc_seqbuf *buf);
static inline uint32_t rc_seqbuf_index(const rc_seqbuf *buf, uint16_t seq) { return seq & (buf->size - 1); }
int rc_seqbuf_contains(const rc_seqbuf *buf, uint16_t seq);
uint32_t rc_seqbuf_insert(rc_seqbuf *buf, uint16_t seq);
void rc_seqbuf_remove(rc_seqbuf *buf, uint16_t seq);
/* Clears first..last inclusive (a forward jump skipped them). */
void rc_seqbuf_remove_range(rc_seqbuf *buf, uint16_t first, uint16_t last);

#endif
