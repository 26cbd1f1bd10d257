/* fuzz_client.c - libFuzzer target for the relay layer above the transport (client.c,
 * messages.c, msgpack.c, frame.c): the input is a sequence of deliveries as the connection
 * would make them, each a kind byte (low 2 bits: 0 CONTROL message, 1 STREAM message,
 * 2 block, 3 disconnect), a u16 LE length and that many bytes. Between deliveries the game
 * side takes every frame, reads every slot's input and event, polls events and sends an
 * input, so the frame store, the decoders and the input path all run on hostile data.
 * Nothing may crash, leak, read out of bounds or trip UBSan. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void take_everything(relay_client_t *client)
{
    relay_frame_t frame;
    relay_event_t event;
    relay_frame_event_t member;
    uint8_t copy[64];
    const uint8_t *input;
    uint32_t i;
    while (relay_client_poll_event(client, &event)) {}
    while (relay_client_next_frame(client, &frame) == 1) {
        for (i = 0; i < frame.slot_count + 1; i++) {
            int length = relay_frame_input(client, i, &input);
            if (length > 0)
                (void)((volatile const uint8_t *)input)[length - 1];
            (void)relay_frame_copy_input(client, i, copy, sizeof copy);
            (void)relay_frame_synthesized(client, i);
        }
        for (i = 0; i < frame.event_count + 1; i++)
            if (relay_frame_event(client, i, &member) == 0 && member.name_length)
                (void)((volatile const char *)member.name)[member.name_length - 1];
    }
    (void)relay_client_send_input(client, (const uint8_t *)"in", 2);
    (void)relay_client_have(client);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static relay_client_t *client;
    relay_client_config_t config;
    size_t position = 0;
    if (client == NULL) {
        relay_client_default_config(&config);
        /* small buffers, so the fuzzer reaches the full and wrapping cases */
        config.max_block_size = 1 << 16;
        config.max_history_size = 1 << 18;
        config.max_message_size = 4096;
        config.reassembly_limit = 8192;
        config.frame_buffer_bytes = 4096;
        config.frame_buffer_count = 64;
        config.event_queue = 8;
        client = relay_client_create(&config);
        if (client == NULL)
            abort();
    }
    /* every run starts from a fresh connection and an empty frame stream */
    if (relay_client_connect(client, "fuzz", "p1", 0, NULL, 0.0) != 0)
        abort();
    rc_client_on_connected(client);
    while (position + 3 <= size) {
        int kind = data[position] & 3;
        size_t length = (size_t)data[position + 1] | ((size_t)data[position + 2] << 8);
        position += 3;
        if (length > size - position)
            length = size - position;
        if (kind == 0 || kind == 1)
            rc_client_on_message(client, kind, data + position, length);
        else if (kind == 2)
            rc_client_on_block(client, data + position, length);
        else
            rc_client_on_disconnected(client, "remote:closed");
        position += length;
        take_everything(client);
    }
    return 0;
}
