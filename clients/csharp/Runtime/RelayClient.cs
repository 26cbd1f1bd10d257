// RelayClient.cs - the idiomatic wrapper over relay_client_t.
//
// Allocation: Create, Connect, Reconnect and Open encode their strings (rare calls); PollEvent
// decodes an event's code and text (events are rare); everything a game calls per frame -
// Update, Wait, NextFrame, CopyInput, Synthesized, FrameEvent, SendInput, ReportChecksum and
// the properties - allocates nothing. Buffers are pinned with `fixed` for the duration of
// the native call only, and byte* overloads exist for callers that hold native memory.
//
// Errors: a negative return code from a call outside the per-frame path becomes a
// RelayException naming the code. On the per-frame path the results are bool/int, as in C.
using System;
using System.Runtime.ConstrainedExecution;
using System.Runtime.InteropServices;

namespace Relay.Client
{
    /// <summary>A negative RELAY_E* return code.</summary>
    public sealed class RelayException : Exception
    {
        public RelayError Code { get; private set; }
        public string Function { get; private set; }

        public RelayException(string function, int code)
            : base(function + " failed: " + CodeName(code) + " (" + Describe(code) + ")")
        {
            Code = (RelayError)code;
            Function = function;
        }

        /// <summary>The C name of a code, e.g. "RELAY_ESTATE".</summary>
        public static string CodeName(int code)
        {
            switch (code)
            {
                case 0: return "RELAY_OK";
                case -1: return "RELAY_EINVAL";
                case -2: return "RELAY_ESTATE";
                case -3: return "RELAY_EFULL";
                case -4: return "RELAY_ETOKEN";
                case -5: return "RELAY_ENOMEM";
                case -6: return "RELAY_ESOCKET";
                case -7: return "RELAY_ESMALL";
                case -8: return "RELAY_NIL";
                default: return "RELAY_E" + code;
            }
        }

        static string Describe(int code)
        {
            switch (code)
            {
                case -1: return "an argument is out of range";
                case -2: return "not possible in the client's current state";
                case -3: return "a fixed queue is full; try again after the next update";
                case -4: return "the connect token text does not decode";
                case -5: return "the allocator failed";
                case -6: return "socket, bind, resolve or send failed";
                case -7: return "the buffer is too small";
                case -8: return "the slot has no input";
                default: return "unknown error";
            }
        }
    }

    /// <summary>Owns one native relay_client_t; ReleaseHandle calls relay_client_destroy
    /// (which also closes the driver's socket), also from the finalizer.</summary>
    public sealed class RelayClientHandle : SafeHandle
    {
        public RelayClientHandle() : base(IntPtr.Zero, true) { }

        internal RelayClientHandle(IntPtr pointer) : base(IntPtr.Zero, true)
        {
            SetHandle(pointer);
        }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        [ReliabilityContract(Consistency.WillNotCorruptState, Cer.Success)]
        protected override bool ReleaseHandle()
        {
            Native.relay_client_destroy(handle);
            return true;
        }
    }

    /// <summary>An event from <see cref="RelayClient.PollEvent"/>. Which fields are meaningful
    /// depends on <see cref="Type"/> (see relay_event_t in relay_client.h).</summary>
    public struct RelayEvent
    {
        RelayEventType type;
        RelayRoomState roomState;
        int slot;
        bool spectator;
        uint tickRate, nextFrame, history, frame, delayFrames, responseMs, late, inputs;
        string code, text;

        internal unsafe RelayEvent(RelayEventNative* native)
        {
            type = (RelayEventType)native->Type;
            roomState = (RelayRoomState)native->RoomState;
            slot = native->Slot;
            spectator = native->Spectator != 0;
            tickRate = native->TickRate;
            nextFrame = native->NextFrame;
            history = native->History;
            frame = native->Frame;
            delayFrames = native->DelayFrames;
            responseMs = native->ResponseMs;
            late = native->Late;
            inputs = native->Inputs;
            code = Native.DecodeCString(native->Code, RelayEventNative.CodeSize);
            text = Native.DecodeCString(native->Text, RelayEventNative.TextSize);
        }

        public RelayEventType Type { get { return type; } }
        /// <summary>WELCOME, ROOM_STATE.</summary>
        public RelayRoomState RoomState { get { return roomState; } }
        /// <summary>WELCOME: our slot, -1 for a spectator.</summary>
        public int Slot { get { return slot; } }
        /// <summary>WELCOME.</summary>
        public bool Spectator { get { return spectator; } }
        /// <summary>WELCOME: frames per second.</summary>
        public uint TickRate { get { return tickRate; } }
        /// <summary>WELCOME: the first frame that comes live.</summary>
        public uint NextFrame { get { return nextFrame; } }
        /// <summary>WELCOME: frames 0..History-1 come as a block.</summary>
        public uint History { get { return history; } }
        /// <summary>ROOM_STATE (frames closed when ended), DESYNC.</summary>
        public uint Frame { get { return frame; } }
        /// <summary>INPUT_DELAY: the advised delay, frames.</summary>
        public uint DelayFrames { get { return delayFrames; } }
        public uint ResponseMs { get { return responseMs; } }
        public uint Late { get { return late; } }
        public uint Inputs { get { return inputs; } }
        /// <summary>REFUSED, NOTICE: the code; ROOM_STATE: the reason; DESYNC: the verdict;
        /// DISCONNECTED: the reason ("timeout", "local:closed", "remote:kicked"...).</summary>
        public string Code { get { return code ?? string.Empty; } }
        /// <summary>REFUSED, NOTICE: the explanation; DESYNC: the minority "a,b".</summary>
        public string Text { get { return text ?? string.Empty; } }

        public override string ToString()
        {
            return Type + " code=" + Code + " text=" + Text;
        }
    }

    /// <summary>One game client of a relay: a wrapper of relay_client_t. Not thread-safe, as
    /// the C client: use it from one thread (the game loop).</summary>
    public sealed unsafe class RelayClient : IDisposable
    {
        readonly RelayClientHandle handle;
        IntPtr client;              // cached handle.DangerousGetHandle(); Zero once disposed
        RelayError lastError;

        RelayClient(RelayClientHandle handle)
        {
            this.handle = handle;
            client = handle.DangerousGetHandle();
        }

        /// <summary>Creates a client with the default configuration.</summary>
        public static RelayClient Create()
        {
            return Create(RelayClientConfig.Default);
        }

        /// <summary>Creates a client; every buffer it will ever use is allocated here.</summary>
        public static RelayClient Create(RelayClientConfig config)
        {
            uint version = Native.relay_client_version();
            if (version >> 16 != Native.VersionMajor)
                throw new InvalidOperationException(string.Format(
                    "the native relay_client library is version {0}.{1}; this binding needs {2}.x",
                    version >> 16, version & 0xFFFF, Native.VersionMajor));
            IntPtr pointer = Native.relay_client_create(ref config);
            if (pointer == IntPtr.Zero)
                throw new RelayException("relay_client_create", (int)RelayError.Invalid);
            return new RelayClient(new RelayClientHandle(pointer));
        }

        /// <summary>Bytes relay_client_create allocates for this config.</summary>
        public static long MemorySize(RelayClientConfig config)
        {
            return (long)Native.relay_client_memory_size(ref config).ToUInt64();
        }

        /// <summary>The library's monotonic clock, seconds: the "now" of every call.</summary>
        public static double Time { get { return Native.relay_client_time(); } }

        /// <summary>The owning SafeHandle (for callers of <see cref="Native"/>).</summary>
        public RelayClientHandle Handle { get { return handle; } }

        public bool IsDisposed { get { return client == IntPtr.Zero; } }

        /// <summary>The code of the last failure on the per-frame path (NextFrame).</summary>
        public RelayError LastError { get { return lastError; } }

        public void Dispose()
        {
            client = IntPtr.Zero;
            handle.Dispose();
        }

        IntPtr Ptr
        {
            get
            {
                if (client == IntPtr.Zero)
                    throw new ObjectDisposedException("RelayClient");
                return client;
            }
        }

        static int Check(string function, int result)
        {
            if (result < 0)
                throw new RelayException(function, result);
            return result;
        }

        // ---- socket driver ----

        /// <summary>Opens a non-blocking UDP socket towards host:port (name or literal).</summary>
        public void Open(string host, int port)
        {
            if (host == null)
                throw new ArgumentNullException("host");
            if (port <= 0 || port > 65535)
                throw new ArgumentOutOfRangeException("port");
            byte[] text = Native.EncodeUtf8(host);
            fixed (byte* h = text)
                Check("relay_client_open", Native.relay_client_open(Ptr, h, (ushort)port));
        }

        /// <summary>A new socket (new local port) towards the same relay: a network change.</summary>
        public void Reopen()
        {
            Check("relay_client_reopen", Native.relay_client_reopen(Ptr));
        }

        public void Close()
        {
            Native.relay_client_close(Ptr);
        }

        /// <summary>Receives every pending datagram, runs timers, sends what is due.</summary>
        public void Update(double now)
        {
            int result = Native.relay_client_update(Ptr, now);
            if (result < 0)
                throw new RelayException("relay_client_update", result);
        }

        /// <summary>Blocks until a datagram arrives, a timer is due or seconds pass.</summary>
        public void Wait(double seconds)
        {
            int result = Native.relay_client_wait(Ptr, seconds);
            if (result < 0)
                throw new RelayException("relay_client_wait", result);
        }

        // ---- connecting and rooms ----

        /// <summary>Starts the handshake and queues JOIN. token: the connect token's text from
        /// the game backend (token mode), or null (open mode); with a token, room and player
        /// may be null.</summary>
        public void Connect(string room, string player, bool spectator, string token, double now)
        {
            byte[] r = Native.EncodeUtf8(room), p = Native.EncodeUtf8(player), t = Native.EncodeUtf8(token);
            fixed (byte* rp = r)
            fixed (byte* pp = p)
            fixed (byte* tp = t)
                Check("relay_client_connect",
                      Native.relay_client_connect(Ptr, rp, pp, spectator ? 1 : 0, tp, now));
        }

        /// <summary>Connects in open mode.</summary>
        public void Connect(string room, string player, double now)
        {
            Connect(room, player, false, null, now);
        }

        /// <summary>A new connection that reclaims our slot; the frame stream continues with no
        /// gap or duplicate. token: a fresh token in token mode, else null.</summary>
        public void Reconnect(string token, double now)
        {
            byte[] t = Native.EncodeUtf8(token);
            fixed (byte* tp = t)
                Check("relay_client_reconnect", Native.relay_client_reconnect(Ptr, tp, now));
        }

        public void Ready()
        {
            Check("relay_client_ready", Native.relay_client_ready(Ptr));
        }

        /// <summary>Sends LEAVE, then closes the connection (out on the next Update).</summary>
        public void Leave(double now)
        {
            Check("relay_client_leave", Native.relay_client_leave(Ptr, now));
        }

        /// <summary>Closes the connection without LEAVE.</summary>
        public void Disconnect(double now)
        {
            Check("relay_client_disconnect", Native.relay_client_disconnect(Ptr, now));
        }

        public RelayState State { get { return (RelayState)Native.relay_client_get_state(Ptr); } }

        // ---- the sans-I/O core (for games with their own sockets) ----

        public void Receive(byte[] data, int length, double now)
        {
            CheckRange(data, length);
            byte empty = 0;
            fixed (byte* d = data)
                Native.relay_client_receive(Ptr, length == 0 ? &empty : d, (UIntPtr)(uint)length, now);
        }

        public void Receive(byte* data, int length, double now)
        {
            Native.relay_client_receive(Ptr, data, (UIntPtr)(uint)length, now);
        }

        /// <summary>The next datagram due now written into buffer: its length, 0 when nothing
        /// is due. The buffer must hold the config's mtu.</summary>
        public int NextDatagram(byte[] buffer, double now)
        {
            if (buffer == null)
                throw new ArgumentNullException("buffer");
            fixed (byte* b = buffer)
                return Check("relay_client_next_datagram",
                             Native.relay_client_next_datagram(Ptr, b, (UIntPtr)(uint)buffer.Length, now));
        }

        public int NextDatagram(byte* buffer, int capacity, double now)
        {
            return Check("relay_client_next_datagram",
                         Native.relay_client_next_datagram(Ptr, buffer, (UIntPtr)(uint)capacity, now));
        }

        /// <summary>When HandleTimeout should run next; negative: no timer.</summary>
        public double NextTimeout { get { return Native.relay_client_next_timeout(Ptr); } }

        public void HandleTimeout(double now)
        {
            Native.relay_client_handle_timeout(Ptr, now);
        }

        // ---- events ----

        /// <summary>The next event, in the order they happened; false if none. Decoding the
        /// event's code and text is the only allocation (events are rare).</summary>
        public bool PollEvent(out RelayEvent ev)
        {
            RelayEventNative native;
            int result = Native.relay_client_poll_event(Ptr, &native);
            if (result <= 0)
            {
                ev = default(RelayEvent);
                return false;
            }
            ev = new RelayEvent(&native);
            return true;
        }

        // ---- frames (the per-frame path: no exceptions on results, no allocation) ----

        /// <summary>The next frame in order: true and fills frame; false if it has not arrived
        /// yet, or if the stream is broken (then <see cref="LastError"/> is set and a
        /// DISCONNECTED "bad_frame" event follows). Its inputs and events are read with
        /// CopyInput, Input, Synthesized and FrameEvent until the next call.</summary>
        public bool NextFrame(out RelayFrame frame)
        {
            RelayFrame f;
            int result = Native.relay_client_next_frame(Ptr, &f);
            if (result <= 0)
            {
                if (result < 0)
                    lastError = (RelayError)result;
                frame = default(RelayFrame);
                return false;
            }
            frame = f;
            return true;
        }

        /// <summary>Copies slot's input in the current frame into buffer: its length (0 or
        /// more), <see cref="RelayError.Nil"/> (-8) when the slot has no input (nil, or past the
        /// frame's slot count), or RELAY_ESMALL (-7) if the buffer is too small.</summary>
        public int CopyInput(int slot, byte[] buffer)
        {
            if (buffer == null)
                throw new ArgumentNullException("buffer");
            if (slot < 0)
                return (int)RelayError.Nil;
            fixed (byte* b = buffer)
                return Native.relay_frame_copy_input(Ptr, (uint)slot, b, (UIntPtr)(uint)buffer.Length);
        }

        /// <summary>As CopyInput, into native memory.</summary>
        public int CopyInput(int slot, byte* buffer, int capacity)
        {
            if (slot < 0)
                return (int)RelayError.Nil;
            return Native.relay_frame_copy_input(Ptr, (uint)slot, buffer, (UIntPtr)(uint)capacity);
        }

        /// <summary>Zero-copy: slot's input length and a pointer into the library's frame buffer
        /// (valid until the next NextFrame), <see cref="RelayError.Nil"/> for nil.</summary>
        public int Input(int slot, out IntPtr data)
        {
            byte* d = null;
            int result = slot < 0 ? (int)RelayError.Nil : Native.relay_frame_input(Ptr, (uint)slot, &d);
            data = (IntPtr)d;
            return result;
        }

        /// <summary>True if the relay made this slot's input up (missing input policy).</summary>
        public bool Synthesized(int slot)
        {
            return slot >= 0 && Native.relay_frame_synthesized(Ptr, (uint)slot) > 0;
        }

        /// <summary>Membership event index (0..EventCount-1) of the current frame.</summary>
        public bool FrameEvent(int index, out RelayFrameEvent e)
        {
            RelayFrameEvent native;
            if (index < 0 || Native.relay_frame_event(Ptr, (uint)index, &native) < 0)
            {
                e = default(RelayFrameEvent);
                return false;
            }
            e = native;
            return true;
        }

        // ---- inputs, checksums ----

        /// <summary>Sends payload[0..length) as our input for the frame the input delay
        /// targets (covering skipped frames, see relay_client_send_input): the number of
        /// frames it was sent for (0 is normal after the delay fell), or a negative RELAY_E*
        /// code (e.g. -2 not joined, -3 queue full).</summary>
        public int SendInput(byte[] payload, int length)
        {
            CheckRange(payload, length);
            byte empty = 0;
            fixed (byte* p = payload)
                return Native.relay_client_send_input(Ptr, length == 0 ? &empty : p, (UIntPtr)(uint)length);
        }

        public int SendInput(byte* payload, int length)
        {
            return Native.relay_client_send_input(Ptr, payload, (UIntPtr)(uint)length);
        }

        /// <summary>Sends payload as our input for one given frame (the caller manages the
        /// delay): 0 or more on success, a negative RELAY_E* code otherwise.</summary>
        public int SendInputFor(uint frame, byte[] payload, int length)
        {
            CheckRange(payload, length);
            byte empty = 0;
            fixed (byte* p = payload)
                return Native.relay_client_send_input_for(Ptr, frame, length == 0 ? &empty : p,
                                                          (UIntPtr)(uint)length);
        }

        public int SendInputFor(uint frame, byte* payload, int length)
        {
            return Native.relay_client_send_input_for(Ptr, frame, payload, (UIntPtr)(uint)length);
        }

        /// <summary>Reports a hash of the game state after applying frame: 0 or a negative
        /// RELAY_E* code.</summary>
        public int ReportChecksum(uint frame, ulong value)
        {
            return Native.relay_client_report_checksum(Ptr, frame, value);
        }

        static void CheckRange(byte[] buffer, int length)
        {
            if (buffer == null)
            {
                if (length != 0)
                    throw new ArgumentNullException("buffer");
                return;
            }
            if (length < 0 || length > buffer.Length)
                throw new ArgumentOutOfRangeException("length");
        }

        // ---- state ----

        public RelayRoomState RoomState { get { return (RelayRoomState)Native.relay_client_room_state(Ptr); } }

        /// <summary>When RoomState is Ended: the number of frames the room produced.</summary>
        public uint FinalFrames { get { return Native.relay_client_final_frames(Ptr); } }

        /// <summary>Our slot; -1 for a spectator or before WELCOME.</summary>
        public int Slot { get { return Native.relay_client_slot(Ptr); } }

        /// <summary>Highest frame H with every frame 0..H held (-1 before frame 0).</summary>
        public long Have { get { return Native.relay_client_have(Ptr); } }

        /// <summary>The next frame number NextFrame will hand out.</summary>
        public uint NextFrameNumber { get { return Native.relay_client_next_frame_number(Ptr); } }

        public int InputDelay
        {
            get { return (int)Native.relay_client_input_delay(Ptr); }
            set
            {
                if (value < 1)
                    throw new ArgumentOutOfRangeException("value");
                Check("relay_client_set_input_delay", Native.relay_client_set_input_delay(Ptr, (uint)value));
            }
        }

        /// <summary>True once the room ended and every frame it produced was taken, or the
        /// connection is gone with no frame left to take: the game can stop.</summary>
        public bool Finished { get { return Native.relay_client_finished(Ptr) != 0; } }

        public RelayStats Stats
        {
            get
            {
                RelayStats stats;
                Native.relay_client_get_stats(Ptr, &stats);
                return stats;
            }
        }
    }
}
