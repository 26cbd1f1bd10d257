/* seqbuf.c - sequence buffers (PROTOCOL 7). */
#include "seqbuf.h"

void rc_seqbuf_init(rc_seqbuf *buf, uint32_t *tags, uint32_t size)
{
    buf->size = size;
    buf->tags = tags;
    rc_seqbuf_clear(buf);
}

void rc_seqbuf_clear(rc_seqbuf *buf)
{
    uint32_t i;
    for (i = 0; i < buf->size; i++)
        buf->tags[i] = RC_SEQBUF_EMPTY;
}

int rc_seqbuf_contains(const rc_seqbuf *buf, uint16_t seq)
{
    return buf->tags[rc_seqbuf_index(buf, seq)] == seq;
}

uint32_t rc_seqbuf_insert(rc_seqbuf *buf, uint16_t seq)
{
    uint32_t index = rc_seqbuf_index(buf, seq);
    buf->tags[index] = seq;
    return index;
}

void rc_seqbuf_remove(rc_seqbuf *buf, uint16_t seq)
{
    uint32_t index = rc_seqbuf_index(buf, seq);
    if (buf->tags[index] == seq)
        buf->tags[index] = RC_SEQBUF_EMPTY;
}

void rc_seqbuf_remove_range(rc_seqbuf *buf, uint16_t first, uint16_t last)
{
    uint32_t count = (uint32_t)(uint16_t)(last - first) + 1, i;
    if (count >= buf->size) {
        rc_seqbuf_clear(buf);
        return;
    }
    for (i = 0; i < count; i++)
        buf->tags[rc_seqbuf_index(buf, (uint16_t)(first + i))] = RC_SEQBUF_EMPTY;
}
