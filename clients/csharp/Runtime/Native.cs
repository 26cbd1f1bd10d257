// Native.cs - P/Invoke declarations and blittable layouts of clients/c/include/relay_client.h.
//
// Every struct here is blittable (no marshalling copies, no allocation): the layouts follow
// the C header field by field with the platform's natural alignment (LayoutKind.Sequential),
// and the test tests/clients/test_csharp_build.py compares Marshal.SizeOf and the field
// offsets against sizeof/offsetof from a C compiler.
//
// Strings (room, player, token, host) are passed as NUL-terminated UTF-8 byte pointers that
// RelayClient encodes itself: the runtime's default string marshalling is ANSI on Windows.
using System;
using System.Runtime.InteropServices;
using System.Security;

namespace Relay.Client
{
    /// <summary>The library's return codes (RELAY_OK, RELAY_E*).</summary>
    public enum RelayError
    {
        Ok = 0,
        /// <summary>RELAY_EINVAL: an argument is out of range (null, too long, bad config).</summary>
        Invalid = -1,
        /// <summary>RELAY_ESTATE: not possible in the client's current state.</summary>
        State = -2,
        /// <summary>RELAY_EFULL: a fixed queue is full; try again after the next update.</summary>
        Full = -3,
        /// <summary>RELAY_ETOKEN: the connect token text does not decode.</summary>
        Token = -4,
        /// <summary>RELAY_ENOMEM: the allocator failed (create only).</summary>
        NoMemory = -5,
        /// <summary>RELAY_ESOCKET: socket, bind, resolve or send failed.</summary>
        Socket = -6,
        /// <summary>RELAY_NIL: the slot has no input in this frame (not an error).</summary>
        Nil = -8,
        /// <summary>RELAY_ESMALL: the caller's buffer is too small.</summary>
        Small = -7,
    }

    /// <summary>relay_client_state_t.</summary>
    public enum RelayState
    {
        Idle = 0,
        Connecting = 1,
        Connected = 2,
        Joined = 3,
    }

    /// <summary>relay_room_state_t.</summary>
    public enum RelayRoomState
    {
        None = 0,
        Waiting = 1,
        Running = 2,
        Ended = 3,
    }

    /// <summary>relay_event_type_t.</summary>
    public enum RelayEventType
    {
        None = 0,
        Connected = 1,
        Welcome = 2,
        Refused = 3,
        RoomState = 4,
        Desync = 5,
        Notice = 6,
        InputDelay = 7,
        Disconnected = 8,
    }

    /// <summary>relay_frame_event_kind_t: membership events carried in a frame.</summary>
    public enum RelayFrameEventKind
    {
        Join = 0,
        Leave = 1,
        Timeout = 2,
        Reconnect = 3,
    }

    /// <summary>relay_link_mode_t: the redundancy controller's reading of the path
    /// (docs/PROTOCOL.md 14.5), which sets how many copies of each unacknowledged input ride
    /// later datagrams.</summary>
    public enum RelayLinkMode
    {
        /// <summary>No recent loss: each message sent once.</summary>
        Clean = 0,
        /// <summary>Independent losses: a copy in the next datagram, more only where an ack is
        /// overdue (a new connection starts here).</summary>
        Lossy = 1,
        /// <summary>Losses in runs: every datagram carries every unacknowledged message.</summary>
        Bursty = 2,
        /// <summary>The RTT stands above the path's floor (a filling queue): no copies.</summary>
        Congested = 3,
    }

    /// <summary>relay_client_config_t. Get one from <see cref="Default"/> and change fields.
    /// The allocator and randomness hooks are C function pointers: leave them IntPtr.Zero
    /// (malloc/free and the OS random source), or set them to native functions.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct RelayClientConfig
    {
        public IntPtr Allocate;          // void *(*)(void *context, size_t bytes)
        public IntPtr Release;           // void (*)(void *context, void *pointer)
        public IntPtr AllocatorContext;
        public IntPtr RandomBytes;       // void (*)(void *context, uint8_t *out, size_t length)
        public IntPtr RandomContext;

        /// <summary>Largest datagram sent, bytes (1200; 576..16384).</summary>
        public uint Mtu;
        private uint reserved;           // explicit padding in C too
        /// <summary>Handshake deadline, seconds (5).</summary>
        public double ConnectTimeout;
        /// <summary>Relay silent this long: disconnected "timeout", seconds (10).</summary>
        public double PeerTimeout;
        /// <summary>Send a datagram at least this often, seconds (0.5).</summary>
        public double HeartbeatInterval;
        /// <summary>Longest an ack waits for data to ride on, seconds (1/30).</summary>
        public double AckDelay;
        public uint MaxMessageSize;
        public uint ReassemblyLimit;
        public uint MaxBlockSize;
        public uint MaxHistorySize;
        public uint FrameBufferBytes;
        public uint FrameBufferCount;
        /// <summary>Frames between the newest frame and the input (2; at least 1).</summary>
        public uint InputDelay;
        /// <summary>Nonzero: adopt the relay's INPUT_DELAY advice (0).</summary>
        public int AutoInputDelay;
        public uint MaxInputSize;
        public uint SendQueue;
        public uint EventQueue;

        /// <summary>Every field at the library's default (relay_client_default_config).</summary>
        public static RelayClientConfig Default
        {
            get
            {
                RelayClientConfig config;
                Native.relay_client_default_config(out config);
                return config;
            }
        }
    }

    /// <summary>relay_client_stats_t.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct RelayStats
    {
        /// <summary>Smoothed round-trip time, seconds (0 before a sample).</summary>
        public double Rtt;
        public double RttVariance;
        /// <summary>0..1, packets of ours judged lost.</summary>
        public double Loss;
        public ulong PacketsSent;
        public ulong PacketsReceived;
        public ulong BytesSent;
        public ulong BytesReceived;
        public ulong FramesReceived;
        public ulong FramesDuplicate;
        public ulong BlocksReceived;
        public ulong DatagramsDropped;
        public ulong EventsDropped;
        public ulong LiveFramesDropped;
        private int redundancyMode;
        private uint reserved;           // explicit padding in C too
        /// <summary>Mean run of our datagrams lost together, as the acks show it (1.0: losses
        /// independent of each other).</summary>
        public double BurstLength;

        /// <summary>How the input stream copies now (redundancy_mode).</summary>
        public RelayLinkMode RedundancyMode { get { return (RelayLinkMode)redundancyMode; } }
    }

    /// <summary>relay_frame_t.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct RelayFrame
    {
        private uint number;
        private uint slotCount;
        private uint eventCount;

        public uint Number { get { return number; } }
        /// <summary>Slots in this frame; a slot past it is nil.</summary>
        public int SlotCount { get { return (int)slotCount; } }
        /// <summary>Membership events (<see cref="RelayClient.FrameEvent"/>).</summary>
        public int EventCount { get { return (int)eventCount; } }
    }

    /// <summary>relay_frame_event_t. The name points into the library's frame buffer and is
    /// valid until the next call of <see cref="RelayClient.NextFrame"/>.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct RelayFrameEvent
    {
        private int kind;
        private int slot;
        private uint nameLength;
        private uint reserved;          // explicit padding in C too
        private IntPtr name;            // const char *, not NUL-terminated

        public RelayFrameEventKind Kind { get { return (RelayFrameEventKind)kind; } }
        public int Slot { get { return slot; } }
        public int NameLength { get { return (int)nameLength; } }
        /// <summary>The raw UTF-8 name (valid until the next frame).</summary>
        public IntPtr NamePointer { get { return name; } }

        /// <summary>The player's name; allocates a string (events are rare: join, leave...).</summary>
        public string Name
        {
            get
            {
                if (nameLength == 0 || name == IntPtr.Zero)
                    return string.Empty;
                unsafe
                {
                    return Native.DecodeUtf8((byte*)name, (int)nameLength);
                }
            }
        }

        /// <summary>Copies the UTF-8 name into buffer without allocating; returns its length,
        /// or -1 if the buffer is too small.</summary>
        public int CopyName(byte[] buffer)
        {
            if (buffer == null)
                throw new ArgumentNullException("buffer");
            if (buffer.Length < nameLength)
                return -1;
            if (nameLength > 0)
                Marshal.Copy(name, buffer, 0, (int)nameLength);
            return (int)nameLength;
        }
    }

    /// <summary>relay_event_t exactly as C lays it out (fixed char arrays).</summary>
    [StructLayout(LayoutKind.Sequential)]
    public unsafe struct RelayEventNative
    {
        public const int CodeSize = 64;
        public const int TextSize = 256;

        public int Type;
        public int RoomState;
        public int Slot;
        public int Spectator;
        public uint TickRate;
        public uint NextFrame;
        public uint History;
        public uint Frame;
        public uint DelayFrames;
        public uint ResponseMs;
        public uint Late;
        public uint Inputs;
        public fixed byte Code[CodeSize];
        public fixed byte Text[TextSize];
    }

    /// <summary>The raw entry points. Use <see cref="RelayClient"/>; these are public for
    /// callers that want the sans-I/O core without the wrapper.</summary>
    [SuppressUnmanagedCodeSecurity]
    public static unsafe class Native
    {
#if UNITY_IOS && !UNITY_EDITOR
        public const string Library = "__Internal";
#else
        public const string Library = "relay_client";
#endif

        public const int VersionMajor = 2;
        public const int VersionMinor = 0;
        public const int MaxName = 64;
        public const int MaxSlots = 256;
        public const int MaxDatagram = 16384;

        // ---- configuration ----
        /// <summary>(major &lt;&lt; 16) | minor of the native library.</summary>
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint relay_client_version();

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_default_config(out RelayClientConfig config);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern UIntPtr relay_client_memory_size(ref RelayClientConfig config);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr relay_client_create(ref RelayClientConfig config);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_destroy(IntPtr client);

        // ---- connecting and rooms ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_connect(IntPtr client, byte* room, byte* player,
                                                      int spectator, byte* token, double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_reconnect(IntPtr client, byte* token, double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_ready(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_leave(IntPtr client, double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_disconnect(IntPtr client, double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_get_state(IntPtr client);

        // ---- the sans-I/O core ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_receive(IntPtr client, byte* data, UIntPtr length,
                                                       double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_next_datagram(IntPtr client, byte* output, UIntPtr cap,
                                                            double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern double relay_client_next_timeout(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_handle_timeout(IntPtr client, double now);

        // ---- events ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_poll_event(IntPtr client, RelayEventNative* ev);

        // ---- frames ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_next_frame(IntPtr client, RelayFrame* frame);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_frame_input(IntPtr client, uint slot, byte** data);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_frame_copy_input(IntPtr client, uint slot, byte* output,
                                                        UIntPtr cap);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_frame_synthesized(IntPtr client, uint slot);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_frame_event(IntPtr client, uint index, RelayFrameEvent* ev);

        // ---- inputs, checksums ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_send_input(IntPtr client, byte* payload, UIntPtr length);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_send_input_for(IntPtr client, uint frame, byte* payload,
                                                             UIntPtr length);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_report_checksum(IntPtr client, uint frame, ulong value);

        // ---- state ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_get_stats(IntPtr client, RelayStats* stats);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint relay_client_next_frame_number(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern long relay_client_have(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint relay_client_input_delay(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_set_input_delay(IntPtr client, uint frames);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_room_state(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint relay_client_final_frames(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_slot(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_finished(IntPtr client);

        // ---- socket driver ----
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern double relay_client_time();

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_open(IntPtr client, byte* host, ushort port);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_reopen(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void relay_client_close(IntPtr client);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_update(IntPtr client, double now);

        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int relay_client_wait(IntPtr client, double timeout);

        // ---- helpers ----

        /// <summary>UTF-8 with a terminating NUL, or null for a null string.</summary>
        internal static byte[] EncodeUtf8(string text)
        {
            if (text == null)
                return null;
            var encoding = System.Text.Encoding.UTF8;
            var bytes = new byte[encoding.GetByteCount(text) + 1];
            encoding.GetBytes(text, 0, text.Length, bytes, 0);
            return bytes;
        }

        internal static string DecodeUtf8(byte* data, int length)
        {
            if (length <= 0)
                return string.Empty;
            return System.Text.Encoding.UTF8.GetString(data, length);
        }

        /// <summary>A NUL-terminated char array of at most capacity bytes.</summary>
        internal static string DecodeCString(byte* data, int capacity)
        {
            int length = 0;
            while (length < capacity && data[length] != 0)
                length++;
            return DecodeUtf8(data, length);
        }
    }
}
