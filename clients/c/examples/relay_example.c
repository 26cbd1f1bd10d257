/* relay_example.c - a complete lockstep game loop against relay_client.h:
 *   relay_example HOST PORT ROOM PLAYER [FRAMES]
 * Joins ROOM, waits for the match to run, sends one input per frame, applies every frame to
 * a toy deterministic simulation, reports a checksum every 30 frames, leaves after FRAMES
 * frames (600) or when the room ends. */
#include "relay_client.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    relay_client_config_t config;
    relay_client_t *client;
    relay_frame_t frame;
    relay_event_t event;
    uint64_t state = 1;                    /* the whole "game": one number */
    int running = 1, failed = 0;
    uint32_t frames = 600;

    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s HOST PORT ROOM PLAYER [FRAMES]\n", argv[0]);
        return 2;
    }
    if (argc == 6)
        frames = (uint32_t)atoi(argv[5]);
    relay_client_default_config(&config);
    config.auto_input_delay = 1;           /* follow the relay's INPUT_DELAY advice */
    client = relay_client_create(&config);
    if (client == NULL || relay_client_open(client, argv[1], (uint16_t)atoi(argv[2])) != 0
        || relay_client_connect(client, argv[3], argv[4], 0, NULL, relay_client_time()) != 0)
        return 1;

    while (running && !relay_client_finished(client)) {
        relay_client_wait(client, 0.005);
        relay_client_update(client, relay_client_time());
        while (relay_client_poll_event(client, &event)) {
            if (event.type == RELAY_EVENT_REFUSED || event.type == RELAY_EVENT_DISCONNECTED) {
                fprintf(stderr, "%s %s\n", event.code, event.text);
                running = 0;
                failed = 1;
            }
            if (event.type == RELAY_EVENT_DESYNC)
                fprintf(stderr, "desync at frame %u\n", (unsigned)event.frame);
        }
        while (running && relay_client_next_frame(client, &frame) == 1) {
            uint32_t slot;
            for (slot = 0; slot < frame.slot_count; slot++) {   /* apply: inputs in slot order */
                const uint8_t *input;
                int length = relay_frame_input(client, slot, &input);
                state = state * 31 + (uint64_t)(length < 0 ? 0 : length + 1);
                if (length > 0)
                    state = state * 31 + input[0];
            }
            if (frame.number % 30 == 29)
                relay_client_report_checksum(client, frame.number, state);
            if (frame.number + 1 >= frames)
                running = 0;
        }
        if (relay_client_room_state(client) == RELAY_ROOM_RUNNING) {
            uint8_t input = (uint8_t)(rand() & 0xFF);          /* "read the controller" */
            relay_client_send_input(client, &input, 1);         /* for next frame + delay */
        }
    }
    relay_client_leave(client, relay_client_time());
    relay_client_update(client, relay_client_time());
    printf("stopped at frame %u, state %016llx\n", (unsigned)relay_client_next_frame_number(client),
           (unsigned long long)state);
    relay_client_destroy(client);
    return failed;
}
