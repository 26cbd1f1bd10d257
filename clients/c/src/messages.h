/*
 * messages.h - the relay's application messages (docs/RELAY_PROTOCOL.md section 4) except
 * FRAME (frame.h): encoders for what a client sends, a decoder for what the relay sends.
 */
#ifndef RC_MESSAGES_H
#define RC_MESSAGES_H

#include <stddef.h>
#include <stdint.h>

enum {
    RM_JOIN = 1, RM_READY = 2, RM_CHECKSUM = 3, RM_LEAVE = 4, RM_INPUT = 5,
    RM_WELCOME = 20, RM_REFUSED = 21, RM_ROOM_STATE = 22, RM_DESYNC = 23, RM_NOTICE = 24,
    RM_INPUT_DELAY = 25
};

#define RM_FRAME_MARKER 0xC1

/* Room states as in relay_room_state_t. */
enum { RM_STATE_NONE = 0, RM_STATE_WAITING = 1, RM_STATE_RUNNING = 2, RM_STATE_ENDED = 3 };

/* Encoders: the message's length, or -1 if it does not fit in cap. */
int rm_encode_join(uint8_t *out, size_t cap, const char *room, const char *player, int spectator);
int rm_encode_ready(uint8_t *out, size_t cap);
int rm_encode_leave(uint8_t *out, size_t cap);
int rm_encode_checksum(uint8_t *out, size_t cap, uint32_t frame, uint64_t value);
int rm_encode_input(uint8_t *out, size_t cap, uint32_t frame, const uint8_t *payload,
                    size_t length, int64_t have);

/* A relay message, decoded. Strings are NUL-terminated and truncated to fit. */
typedef struct rm_message {
    int type;                     /* RM_WELCOME .. RM_INPUT_DELAY */
    /* WELCOME */
    char room[65];
    char player[65];
    int32_t slot;                 /* -1: nil (spectator) */
    uint32_t tick_rate;
    int state;                    /* WELCOME, ROOM_STATE: RM_STATE_* (NONE if unknown text) */
    uint32_t next_frame;
    uint32_t history;
    int spectator;
    /* ROOM_STATE, DESYNC */
    uint32_t frame;
    /* INPUT_DELAY */
    uint32_t delay_frames, response_ms, late, inputs;
    /* REFUSED, NOTICE: code, text; ROOM_STATE: code = reason ("" for nil);
     * DESYNC: code = verdict, text = minority joined with "," */
    char code[64];
    char text[256];
} rm_message;

/* Decodes one relay message (not a FRAME). Returns 1 and fills *message for a known type, 0
 * for a well-formed message of a type this client does not know (ignored), -1 if malformed.
 * Elements beyond the known ones are ignored. */
int rm_decode(const uint8_t *data, size_t length, rm_message *message);

#endif
